"""ONNX Runtime's contrib QMoE (`quant_type` fp4: MXFP4 codes, E8M0 block scales) over one gpt-oss layer's
experts, to measure against our MXFP4MoE kernel on the same layer (bench/engine_check.py). QMoE's fp4 path
has kernels on CUDA only. The weights as the engine's `moe` qmoe graph has them (backends/engine/qmoe.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from backends.engine.config import ModelConfig
from backends.engine.graph import IR_VERSION, Dtype, GraphOptions, TensorWriter
from backends.engine.op_models import moe_layer_graph
from backends.engine.qmoe import MS_DOMAIN, qmoe_node, qmoe_weights


def qmoe_layer_model(config: ModelConfig, tensors: dict[str, np.ndarray], directory: Path, dtype: Dtype) -> Path:
    """One QMoE node (x [T, H], router_logits [T, E] in; y out; the names of the MXFP4MoE layer model) over the
    layer's checkpoint tensors. The .onnx path."""
    options = GraphOptions(16, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"qmoe-{dtype}.onnx"
    writer = TensorWriter(path.with_suffix(".onnx.data"))
    initializers: list[TensorProto] = [writer.array("global_scale", np.ones(config.num_experts, np.float32))]
    projections = []
    try:
        for fc in ("mlp1", "mlp2"):
            blocks = tensors[f"{fc}_weight.blocks"]
            codes, scales = qmoe_weights(fc, blocks, tensors[f"{fc}_weight.scales"])
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
