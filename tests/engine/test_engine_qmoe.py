"""The engine's `moe` qmoe: each MoE as ONNX Runtime's contrib QMoE (fp4) over the checkpoint's MXFP4 bytes.
Its numbers need CUDA (tests/engine/test_gpu.py compares the QMoE decoder with the CPU float32 decoder there); here,
the graph it builds holds what QMoE's schema asks for, ONNX Runtime resolves all of it but the CUDA-only
kernel, and the options that cannot run it are refused naming the option."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from onnx import TensorProto, helper, numpy_helper

from backends.engine.backend import from_options
from backends.engine.checkpoint import Checkpoint
from backends.engine.config import SWIGLU_ALPHA
from backends.engine.graph import GraphOptions
from backends.engine.model_cache import compiled_model
from backends.engine.qmoe import codes_by_column, qmoe_unsupported_reason
from harmony import load_harmony_encoding

CONFIG = replace(tiny_config(experts=8, top_k=4, layers=2, vocab=201088), intermediate_size=96)  # I != H


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Checkpoint:
    return Checkpoint(make_checkpoint(tmp_path_factory.mktemp("qmoe") / "ckpt", CONFIG, "original"))


def _initializers(model: onnx.ModelProto, directory: Path) -> dict[str, np.ndarray]:
    """Every initializer's raw bytes (FLOAT8E8M0 as uint8), read from the external data file."""
    onnx.external_data_helper.load_external_data_for_model(model, str(directory))
    arrays = {}
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT8E8M0:
            arrays[tensor.name] = np.frombuffer(tensor.raw_data, np.uint8).reshape(tuple(tensor.dims))
        else:
            arrays[tensor.name] = numpy_helper.to_array(tensor)
    return arrays


def test_each_layer_is_one_qmoe_node_over_the_checkpoints_codes_by_column(checkpoint, tmp_path):
    path = compiled_model(checkpoint, GraphOptions(64, "float16", "qmoe"), tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    assert [function.name for function in model.functions] == ["PagedAttention"]
    assert all(node.op_type != "MXFP4MoE" for node in model.graph.node)
    nodes = [node for node in model.graph.node if node.op_type == "QMoE"]
    assert len(nodes) == CONFIG.num_hidden_layers
    arrays = _initializers(model, path.parent)
    h, i, e = CONFIG.hidden_size, CONFIG.intermediate_size, CONFIG.num_experts
    for layer, node in enumerate(nodes):
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["quant_type"] == b"fp4" and attributes["block_size"] == 32
        assert attributes["expert_weight_bits"] == 4 and attributes["k"] == CONFIG.experts_per_token
        assert attributes["swiglu_fusion"] == 1 and attributes["normalize_routing_weights"] == 1
        assert attributes["activation_type"] == b"swiglu" and attributes["activation_beta"] == 1.0
        assert attributes["swiglu_limit"] == pytest.approx(CONFIG.swiglu_limit)
        assert attributes["activation_alpha"] == pytest.approx(SWIGLU_ALPHA)
        inputs = list(node.input)
        assert len(inputs) == 17 and all(name == "" for name in inputs[8:15])
        prefix = f"block.{layer}.mlp."
        # codes by column, fc1 [E, H, 2I/2] and fc2 [E, I, H/2]; scales as stored, [E, 2I, H/32] and [E, H, I/32]
        for (codes, scales, bias), fc, shape in (
            (inputs[2:5], "mlp1", (e, 2 * i, h)),
            (inputs[5:8], "mlp2", (e, h, i)),
        ):
            blocks = checkpoint.tensor(prefix + fc + "_weight.blocks")
            assert arrays[codes].shape == (shape[0], shape[2], shape[1] // 2)
            assert np.array_equal(arrays[codes], codes_by_column(blocks))
            assert arrays[scales].shape == (shape[0], shape[1], shape[2] // 32)
            assert arrays[scales].tobytes() == checkpoint.tensor(prefix + fc + "_weight.scales").tobytes()
            expected_bias = checkpoint.tensor(prefix + fc + "_bias").astype(np.float32).astype(np.float16)
            assert np.array_equal(arrays[bias], expected_bias)
        assert all(np.array_equal(arrays[name], np.ones(e, np.float32)) for name in inputs[15:17])
        router = next(n for n in model.graph.node if n.output[0] == inputs[1])
        assert router.op_type == "Reshape" and list(arrays[router.input[1]]) == [-1, e]  # QMoE takes [T, E]


def test_onnx_runtime_resolves_the_qmoe_graph_up_to_the_cuda_only_kernel(checkpoint, tmp_path):
    path = compiled_model(checkpoint, GraphOptions(64, "float16", "qmoe"), tmp_path)
    with pytest.raises(Exception, match="QMoE") as error:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert "NOT_IMPLEMENTED" in str(error.value)  # every other node loaded; only QMoE has no CPU fp4 kernel


def test_the_two_realizations_are_cached_apart(checkpoint, tmp_path):
    ours = compiled_model(checkpoint, GraphOptions(64, "float16"), tmp_path)
    theirs = compiled_model(checkpoint, GraphOptions(64, "float16", "qmoe"), tmp_path)
    assert ours.parent != theirs.parent
    assert any(node.op_type == "MXFP4MoE" for node in onnx.load(str(ours), load_external_data=False).graph.node)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"device": "cpu"}, "moe qmoe needs the cuda device"),
        ({"dtype": "float32"}, "moe qmoe needs dtype float16 or bfloat16"),
    ],
)
def test_options_that_cannot_run_qmoe_are_refused_naming_the_option(options, reason):
    with pytest.raises(ValueError, match=f"options.{reason}"):
        from_options({"moe": "qmoe", **options}, load_harmony_encoding())


def test_qmoe_has_kernels_only_on_cuda_in_16_bit():
    assert qmoe_unsupported_reason("cuda", "bfloat16") is None
    assert qmoe_unsupported_reason("cuda", "float16") is None
    assert "cuda device" in str(qmoe_unsupported_reason("cpu", "float16"))
    assert "float16 or bfloat16" in str(qmoe_unsupported_reason("cuda", "float32"))
