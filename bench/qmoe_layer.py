"""ONNX Runtime's contrib QMoE (`quant_type` fp4: MXFP4 codes, E8M0 block scales) over one gpt-oss layer's
experts, to measure against our MXFP4MoE kernel on the same layer (bench/engine_check.py). QMoE's fp4 path
has kernels on CUDA only.

Its schema declares fc1's weights [E, 2I, H/2] (the checkpoint's own bytes) yet calls the weights column-major
per expert, and onnxruntime-genai's gpt-oss builder hands it [E, H, 2I/2], two codes a byte along the output
rows. Both layouts are built, so that a run on a GPU shows which one ONNX Runtime reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from backends.engine.config import ModelConfig
from backends.engine.graph import IR_VERSION, SWIGLU_ALPHA, Dtype, GraphOptions, TensorWriter, moe_layer_graph

MS_DOMAIN = "com.microsoft"
LAYOUTS = ("rows", "columns")  # rows: [E, N, K/2] as the checkpoint stores them; columns: [E, K, N/2]


def codes_by_column(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 blocks [E, N, K/32, 16] (two codes a byte along K, low nibble first) as [E, K, N/2]: the codes of
    each input column, two a byte along the output rows (low nibble: the even row)."""
    experts, rows, groups, _ = blocks.shape
    out = np.empty((experts, groups * 32, rows // 2), np.uint8)
    for expert in range(experts):  # one expert at a time: gpt-oss-20b's fc1 codes are 530 MB unpacked
        packed = blocks[expert].reshape(rows, groups * 16)
        codes = np.empty((rows, groups * 32), np.uint8)
        codes[:, 0::2] = packed & 0xF
        codes[:, 1::2] = packed >> 4
        columns = codes.T
        out[expert] = columns[:, 0::2] | (columns[:, 1::2] << 4)
    return out


def qmoe_layer_model(
    config: ModelConfig, tensors: dict[str, np.ndarray], directory: Path, dtype: Dtype, layout: str
) -> Path:
    """One QMoE node (x [T, H], router_logits [T, E] in; y out; the names of the MXFP4MoE layer model) over the
    layer's checkpoint tensors, its weights in `layout`. The .onnx path."""
    options = GraphOptions(16, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"qmoe-{layout}-{dtype}.onnx"
    writer = TensorWriter(path.with_suffix(".onnx.data"))
    initializers: list[TensorProto] = []
    names: dict[str, str] = {}
    try:
        for fc, number in (("mlp1", 1), ("mlp2", 2)):
            blocks, scales = tensors[f"{fc}_weight.blocks"], tensors[f"{fc}_weight.scales"]
            experts, rows, groups, _ = blocks.shape
            if layout == "rows":
                weights = writer.tensor(f"fc{number}.w", TensorProto.UINT8, [experts, rows, groups * 16], blocks)
            else:
                by_column = codes_by_column(blocks)
                weights = writer.tensor(f"fc{number}.w", TensorProto.UINT8, list(by_column.shape), by_column)
            bias = tensors[f"{fc}_bias"].astype(np.float32).astype(options.numpy_type)
            initializers += [
                weights,
                writer.tensor(f"fc{number}.s", TensorProto.FLOAT8E8M0, list(scales.shape), scales),
                writer.array(f"fc{number}.b", bias),
                writer.array(f"fc{number}.g", np.ones(experts, np.float32)),  # no global scale
            ]
            names.update({f"w{number}": f"fc{number}.w", f"s{number}": f"fc{number}.s"})
            names.update({f"b{number}": f"fc{number}.b", f"g{number}": f"fc{number}.g"})
    finally:
        writer.close()
    unused = ""  # fc3 (fused into fc1 by swiglu_fusion), zero points, separate routing weights
    inputs = ["x", "router_logits", names["w1"], names["s1"], names["b1"], names["w2"], names["s2"], names["b2"]]
    inputs += [unused] * 7 + [names["g1"], names["g2"]]
    node = helper.make_node(
        "QMoE",
        inputs,
        ["y"],
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
    graph = moe_layer_graph("qmoe", node, config, options, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)], producer_name="bench"
    )
    model.ir_version = IR_VERSION
    path.write_bytes(model.SerializeToString())
    return path
