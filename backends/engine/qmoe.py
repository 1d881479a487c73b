"""ONNX Runtime's contrib `QMoE` (quant_type fp4) as the engine's other MoE realization, beside MXFP4MoE.

Its inputs are the checkpoint's MXFP4 bytes as its schema declares them: codes [E, N, K/2] (two a byte,
low nibble first), E8M0 scales [E, N, K/32] as float8e8m0, the biases in the activation dtype and per-expert
global scales of 1. Gate and linear rows stay interleaved (`swiglu_fusion` 1) and the routing weights are the
softmax over each token's top-k logits, as gpt-oss has them. ONNX Runtime has fp4 QMoE kernels on CUDA only,
in float16 and bfloat16. Its schema calls the weights column-major per expert but declares fc1's shape
[E, 2I, H/2], the checkpoint's own; bench/engine_check.py compares this layout and the transposed one with
our kernel on a GPU.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper

from .config import SWIGLU_ALPHA, ModelConfig

MoeRealization = Literal["mxfp4moe", "qmoe"]
MS_DOMAIN = "com.microsoft"
QMOE_DTYPES = ("float16", "bfloat16")
UNUSED = ""  # an omitted optional input


def qmoe_unsupported_reason(device: str, dtype: str) -> str | None:
    """None where QMoE (fp4) has a kernel for this device and dtype; else why not, naming the option."""
    if device != "cuda":
        return f"moe qmoe needs the cuda device (ONNX Runtime has fp4 QMoE kernels on CUDA only), not {device}"
    if dtype not in QMOE_DTYPES:
        return f"moe qmoe needs dtype float16 or bfloat16, not {dtype}"
    return None


def qmoe_weights(
    name: str, blocks: np.ndarray, scales: np.ndarray
) -> tuple[tuple[str, int, list[int], np.ndarray], tuple[str, int, list[int], np.ndarray]]:
    """One projection's checkpoint MXFP4 (blocks [E, N, K/32, 16], scales [E, N, K/32]) as QMoE's codes and
    scales: (name, ONNX type, shape, bytes) each, the bytes unchanged."""
    experts, rows, groups, _ = blocks.shape
    codes = (name + ".qmoe", TensorProto.UINT8, [experts, rows, groups * 16], blocks)
    block_scales = (name + ".qmoe_scales", TensorProto.FLOAT8E8M0, list(scales.shape), scales)
    return codes, block_scales


def qmoe_node(
    config: ModelConfig,
    x: str,
    router_logits: str,
    fc1: tuple[str, str, str],
    fc2: tuple[str, str, str],
    global_scales: tuple[str, str],
    out: str,
) -> onnx.NodeProto:
    """The QMoE node: x [..., H] and router_logits [T, E] in; fc1/fc2 are (codes, scales, bias) names."""
    inputs = [x, router_logits, *fc1, *fc2]
    inputs += [UNUSED] * 7  # fc3 (fused into fc1), zero points, separate routing weights
    inputs += list(global_scales)
    return helper.make_node(
        "QMoE",
        inputs,
        [out],
        domain=MS_DOMAIN,
        k=config.experts_per_token,
        activation_type="swiglu",
        swiglu_fusion=1,  # gate and linear rows interleaved, as the checkpoint has them
        swiglu_limit=config.swiglu_limit,
        activation_alpha=SWIGLU_ALPHA,
        activation_beta=1.0,
        normalize_routing_weights=1,  # softmax over the top-k logits
        quant_type="fp4",
        expert_weight_bits=4,
        block_size=32,
    )
