"""An independent NumPy gpt-oss forward pass, for parity tests of the engine.

Written from the architecture (the gpt-oss reference model's maths), in float64, token by token with a
plain KV cache. It reads original-layout safetensors itself and shares no code with `backends.engine`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def _load(directory: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as handle:
            names = handle.keys()
            for name in names:
                tensors[name] = handle.get_tensor(name)
    return tensors


def _mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., G, 16] bytes and [..., G] exponents → [..., G*32]: low nibble first, value × 2^(scale-127)."""
    low = FP4_VALUES[blocks & 0x0F]
    high = FP4_VALUES[blocks >> 4]
    values = np.stack([low, high], axis=-1).reshape(*blocks.shape[:-1], 32)
    values = values * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


class ReferenceModel:
    def __init__(self, directory: Path) -> None:
        self.config = json.loads((directory / "config.json").read_text())
        raw = _load(directory)
        self.w = {
            name: (
                _mxfp4(raw[name], raw[name.replace(".blocks", ".scales")])
                if name.endswith(".blocks")
                else raw[name].astype(np.float64)
            )
            for name in raw
            if not name.endswith(".scales")
        }
        c = self.config
        self.layers = c["num_hidden_layers"]
        self.heads, self.kv_heads, self.dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.inv_freq, self.concentration = self._yarn()
        self.reset()

    def _yarn(self) -> tuple[np.ndarray, float]:
        c = self.config
        d, theta, factor = self.dim, c["rope_theta"], c["rope_scaling_factor"]
        freq = theta ** (np.arange(0, d, 2) / d)
        half = d / 2
        low = half * math.log(c["initial_context_length"] / (c["rope_ntk_beta"] * 2 * math.pi)) / math.log(theta)
        high = half * math.log(c["initial_context_length"] / (c["rope_ntk_alpha"] * 2 * math.pi)) / math.log(theta)
        ramp = (np.arange(half) - low) / (high - low)
        mask = 1 - np.clip(ramp, 0, 1)
        interpolation, extrapolation = 1 / (factor * freq), 1 / freq
        return interpolation * (1 - mask) + extrapolation * mask, 0.1 * math.log(factor) + 1

    def reset(self) -> None:
        self.keys: list[list[np.ndarray]] = [[] for _ in range(self.layers)]
        self.values: list[list[np.ndarray]] = [[] for _ in range(self.layers)]

    @staticmethod
    def _norm(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x) + 1e-5) * scale

    def _rotate(self, x: np.ndarray, position: int) -> np.ndarray:
        angle = position * self.inv_freq
        cos, sin = np.cos(angle) * self.concentration, np.sin(angle) * self.concentration
        first, second = x[..., : self.dim // 2], x[..., self.dim // 2 :]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    def _attention(self, n: int, x: np.ndarray, position: int) -> np.ndarray:
        w, b = self.w, f"block.{n}.attn."
        qkv = w[b + "qkv.weight"] @ self._norm(x, w[b + "norm.scale"]) + w[b + "qkv.bias"]
        q_end, k_end = self.heads * self.dim, (self.heads + self.kv_heads) * self.dim
        q = self._rotate(qkv[:q_end].reshape(self.heads, self.dim), position)
        self.keys[n].append(self._rotate(qkv[q_end:k_end].reshape(self.kv_heads, self.dim), position))
        self.values[n].append(qkv[k_end:].reshape(self.kv_heads, self.dim))
        first = 0
        if n % 2 == 0:  # sliding layers: the last `sliding_window` positions, this one included
            first = max(0, position + 1 - self.config["sliding_window"])
        keys = np.stack(self.keys[n][first:])  # [T, kv_heads, dim]
        values = np.stack(self.values[n][first:])
        group = self.heads // self.kv_heads
        out = np.empty((self.heads, self.dim))
        for head in range(self.heads):
            scores = keys[:, head // group, :] @ q[head] / math.sqrt(self.dim)
            scores = np.append(scores, w[b + "sinks"][head])  # the sink: one more logit, then dropped
            weights = np.exp(scores - scores.max())
            weights = weights[:-1] / weights.sum()
            out[head] = weights @ values[:, head // group, :]
        return x + w[b + "out.weight"] @ out.reshape(-1) + w[b + "out.bias"]

    def _experts(self, n: int, x: np.ndarray) -> np.ndarray:
        w, b = self.w, f"block.{n}.mlp."
        h = self._norm(x, w[b + "norm.scale"])
        router = w[b + "gate.weight"] @ h + w[b + "gate.bias"]
        chosen = np.argsort(-router, kind="stable")[: self.config["experts_per_token"]]
        gates = np.exp(router[chosen] - router[chosen].max())
        gates /= gates.sum()
        limit = self.config["swiglu_limit"]
        total = np.zeros_like(x)
        for expert, gate in zip(chosen, gates, strict=True):
            up = w[b + "mlp1_weight.blocks"][expert] @ h + w[b + "mlp1_bias"][expert]
            glu, linear = np.minimum(up[0::2], limit), np.clip(up[1::2], -limit, limit)
            activated = glu / (1 + np.exp(-1.702 * glu)) * (linear + 1)
            total += gate * (w[b + "mlp2_weight.blocks"][expert] @ activated + w[b + "mlp2_bias"][expert])
        return x + total

    def step(self, token: int, position: int) -> np.ndarray:
        """Feed one token at `position`; the logits for the next one."""
        x = self.w["embedding.weight"][token]
        for n in range(self.layers):
            x = self._experts(n, self._attention(n, x, position))
        return self.w["unembedding.weight"] @ self._norm(x, self.w["norm.scale"])


def drift_from_reference(
    runtime: Any, reference: ReferenceModel, prompt: list[int], tokens: list[int], clear: float, with_prefill: bool
) -> tuple[float, float]:
    """(largest, root-mean-square) difference of `runtime`'s logits from the reference's, over the reference's
    standard deviation at each step, the worst step's: after the prompt (`with_prefill`) and at each decode of
    `tokens` (the engine's greedy answer). Each of those tokens must be the reference's argmax wherever the
    reference's top two logits are more than `clear` standard deviations apart."""
    logits = runtime.prefill(0, prompt)
    for position, token in enumerate(prompt):
        expected = reference.step(token, position)
    worst, rms = _relative(logits, expected) if with_prefill else (0.0, 0.0)
    for position, token in enumerate(tokens, start=len(prompt)):
        top_two = np.sort(expected)[-2:]
        if top_two[1] - top_two[0] > clear * expected.std():  # a clear choice: the same token
            assert token == int(np.argmax(expected))
        logits, expected = runtime.decode([(0, token, position)])[0], reference.step(token, position)
        step_worst, step_rms = _relative(logits, expected)
        worst, rms = max(worst, step_worst), max(rms, step_rms)
    return worst, rms


def _relative(logits: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    difference, spread = np.abs(logits - expected), float(expected.std())
    return float(difference.max()) / spread, float(np.sqrt((difference**2).mean())) / spread
