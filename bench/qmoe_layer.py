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
from backends.engine.graph import IR_VERSION, Dtype, GraphOptions, TensorWriter, moe_layer_graph
from backends.engine.qmoe import MS_DOMAIN, qmoe_node, qmoe_weights

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
    layer's checkpoint tensors, its weights in `layout` (rows: the engine's `moe` qmoe graph). The .onnx path."""
    options = GraphOptions(16, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"qmoe-{layout}-{dtype}.onnx"
    writer = TensorWriter(path.with_suffix(".onnx.data"))
    initializers: list[TensorProto] = [writer.array("global_scale", np.ones(config.num_experts, np.float32))]
    projections = []
    try:
        for fc in ("mlp1", "mlp2"):
            blocks = tensors[f"{fc}_weight.blocks"]
            codes, scales = qmoe_weights(fc, blocks, tensors[f"{fc}_weight.scales"])
            if layout == "columns":
                by_column = codes_by_column(blocks)
                codes = (codes[0], codes[1], list(by_column.shape), by_column)
            initializers += [writer.tensor(*codes), writer.tensor(*scales)]
            bias = writer.array(f"{fc}.bias", tensors[f"{fc}_bias"].astype(np.float32).astype(options.numpy_type))
            initializers.append(bias)
            projections.append((codes[0], scales[0], bias.name))
    finally:
        writer.close()
    node = qmoe_node(config, "x", "router_logits", projections[0], projections[1], ("global_scale",) * 2, "y")
    graph = moe_layer_graph("qmoe", node, config, options, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)], producer_name="bench"
    )
    model.ir_version = IR_VERSION
    path.write_bytes(model.SerializeToString())
    return path
