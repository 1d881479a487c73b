"""YaRN rotary tables for gpt-oss: cos and sin per position, the attention concentration folded in."""

from __future__ import annotations

import math

import numpy as np

from .config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """YaRN-blended inverse frequencies, [head_dim / 2], in float64."""
    dim = config.head_dim
    theta = config.rope_theta
    freq = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor = config.rope_scaling_factor
    if factor <= 1.0:
        return 1.0 / freq
    half = dim / 2
    context = config.initial_context_length
    low = half * math.log(context / (config.rope_ntk_beta * 2 * math.pi)) / math.log(theta)
    high = half * math.log(context / (config.rope_ntk_alpha * 2 * math.pi)) / math.log(theta)
    ramp = (np.arange(half, dtype=np.float64) - low) / (high - low)
    mask = 1 - np.clip(ramp, 0, 1)
    return (1 / (factor * freq)) * (1 - mask) + (1 / freq) * mask


def concentration(config: ModelConfig) -> float:
    factor = config.rope_scaling_factor
    return 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0


def cos_sin(config: ModelConfig, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """[positions, head_dim / 2] cos and sin tables (float32), each times the concentration."""
    angles = np.arange(positions, dtype=np.float64)[:, None] * inverse_frequencies(config)[None, :]
    scale = concentration(config)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)
