"""Models of one custom-domain op over real weights (an MXFP4 MoE layer, a dense projection): what the kernels'
tests and benches check and time, apart from the decoder graph (graph.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from .config import ModelConfig
from .graph import (
    Dtype,
    GraphOptions,
    TensorWriter,
    dense_bf16_function,
    dense_int8_function,
    model_proto,
    moe_attributes,
    mxfp4_initializers,
)
from .opsets import ENGINE_DOMAIN, IR_VERSION, OPSET


def moe_layer_model(
    config: ModelConfig,
    tensors: dict[str, np.ndarray],
    directory: Path,
    dtype: Dtype = "float32",
    int8_activations: int = 0,
) -> Path:
    """One MXFP4MoE node (x [T, H], router_logits [T, E] in; y out) over one layer's checkpoint tensors
    (`mlp1_weight.blocks`/`.scales`, `mlp1_bias`, the same for mlp2), written under `directory`: to check
    and time realizations (`int8_activations`: the node's attribute, int8 pieces of the decode path's
    activations, 0 for float). The .onnx path."""
    options = GraphOptions(16, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"moe-{dtype}{f'-int8x{int8_activations}' if int8_activations else ''}.onnx"
    writer = TensorWriter(path.with_suffix(".onnx.data"))
    initializers: list[TensorProto] = []
    inputs = ["x", "router_logits"]
    try:
        for fc in ("mlp1", "mlp2"):
            codes, scales = mxfp4_initializers(
                writer, fc, tensors[f"{fc}_weight.blocks"], tensors[f"{fc}_weight.scales"]
            )
            bias = writer.array(fc + ".bias", tensors[f"{fc}_bias"].astype(np.float32).astype(options.numpy_type))
            initializers += [codes, scales, bias]
            inputs += [codes.name, scales.name, bias.name]
    finally:
        writer.close()
    node = helper.make_node("MXFP4MoE", inputs, ["y"], domain=ENGINE_DOMAIN, **moe_attributes(config, int8_activations))
    graph = moe_layer_graph("mxfp4_moe", node, config, options, initializers)
    path.write_bytes(model_proto(graph, config, options).SerializeToString())
    return path


def moe_layer_graph(
    name: str, node: onnx.NodeProto, config: ModelConfig, options: GraphOptions, initializers: list[TensorProto]
) -> onnx.GraphProto:
    """A graph of one MoE layer's node: x [T, H] and router_logits [T, E] in, y [T, H] out."""
    act = options.onnx_type
    return helper.make_graph(
        [node],
        name,
        [
            helper.make_tensor_value_info("x", act, ["tokens", config.hidden_size]),
            helper.make_tensor_value_info("router_logits", act, ["tokens", config.num_experts]),
        ],
        [helper.make_tensor_value_info("y", act, ["tokens", config.hidden_size])],
        initializers,
    )


def dense_model(weight: np.ndarray, path: Path, scale: np.ndarray | None = None) -> Path:
    """One DenseBF16 node (x [T, K] float in, y [T, N] out) over `weight` [N, K] bf16, or with `scale` [N] one
    DenseInt8 node over `weight` in int8, written to `path`: to check and time their realizations."""
    writer = TensorWriter(path.with_suffix(".onnx.data"))
    try:
        initializers = [writer.array("w", weight)]
        if scale is not None:
            initializers.append(writer.array("scale", scale))
    finally:
        writer.close()
    rows, width = weight.shape
    op, inputs = ("DenseBF16", ["x", "w"]) if scale is None else ("DenseInt8", ["x", "w", "scale"])
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], domain=ENGINE_DOMAIN)],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", rows])],
        initializers,
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(ENGINE_DOMAIN, 1)]
    function = dense_bf16_function() if scale is None else dense_int8_function()
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    model.ir_version = IR_VERSION
    path.write_bytes(model.SerializeToString())
    return path
