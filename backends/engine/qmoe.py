"""ONNX Runtime's contrib `QMoE` (quant_type fp4) as the engine's other MoE realization, beside MXFP4MoE.

Its inputs are the checkpoint's MXFP4 codes by column, [E, K, N/2]: each input column's codes two a byte
along the output rows (low nibble: the even row). That is what its kernels read: on an H200, ONNX Runtime
1.31.1's QMoE agreed with our MXFP4MoE kernel within bf16 rounding in this layout and not at all in the
checkpoint's own [E, N, K/2] that its schema declares (docs/engine_check_kernels.json). The E8M0 scales stay
as the checkpoint has them, [E, N, K/32] as float8e8m0; the biases in the activation dtype and per-expert
global scales of 1. Gate and linear rows stay interleaved (`swiglu_fusion` 1) and the routing weights are the
softmax over each token's top-k logits, as gpt-oss has them. ONNX Runtime has fp4 QMoE kernels on CUDA only,
in float16 and bfloat16.
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


def codes_by_column(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 blocks [E, N, K/32, 16] (two codes a byte along K, low nibble first) as [E, K, N/2]: the codes of
    each input column, two a byte along the output rows (low nibble: the even row). Byte arithmetic, one
    expert at a time: a code pair never leaves its byte."""
    experts, rows, groups, _ = blocks.shape
    out = np.empty((experts, groups * 32, rows // 2), np.uint8)
    for expert in range(experts):
        packed = np.asarray(blocks[expert]).reshape(rows, groups * 16)
        even, odd = packed[0::2], packed[1::2]  # [N/2, K/2]: rows 2m and 2m + 1
        by_pair = out[expert].reshape(groups * 16, 2, rows // 2)  # [K/2, 2, N/2]: columns 2j and 2j + 1
        by_pair[:, 0, :] = ((even & 0xF) | ((odd & 0xF) << 4)).T
        by_pair[:, 1, :] = ((even >> 4) | (odd & 0xF0)).T
    return out


def qmoe_weights(
    name: str, blocks: np.ndarray, scales: np.ndarray
) -> tuple[tuple[str, int, list[int], np.ndarray], tuple[str, int, list[int], np.ndarray]]:
    """One projection's checkpoint MXFP4 (blocks [E, N, K/32, 16], scales [E, N, K/32]) as QMoE's codes
    [E, K, N/2] and scales (as stored): (name, ONNX type, shape, bytes) each."""
    by_column = codes_by_column(blocks)
    codes = (name + ".qmoe", TensorProto.UINT8, list(by_column.shape), by_column)
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
