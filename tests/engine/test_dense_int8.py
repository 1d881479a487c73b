"""Dense weights in 8 bits, the engine's `dense_int8` option on the CPU: each row of a bf16 weight as int8 with a
float scale (`int8_rows`), read by the DenseInt8 kernel (C++: int8 widened exactly, the row's sums scaled), which
equals its portable realization and a float64 product over the same int8 values at gpt-oss's widths, in its
vectorized and portable builds. Served at the real width (hidden 2880, vocabulary 201,088) through the public
backend, its logits stay within a stated bound of the NumPy reference of the bf16 checkpoint, and its greedy
tokens are the reference's wherever the reference's top two logits are further apart than twice that bound.
Per-row scales cost accuracy on rows with outliers: the bound is the option's, not the bf16 path's (2e-4)."""

from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import onnx
import pytest
from engine_fixtures import REAL_WIDTH, REAL_WIDTH_PROMPT, greedy_tokens, kernel_builds, kernel_session, make_checkpoint
from engine_reference import ReferenceModel, drift_from_reference
from pydantic import ValidationError

from backends.engine.backend import EngineOptions
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions, int8_rows
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.op_models import dense_model
from backends.engine.paged_runner import PagedRunner

RELATIVE = 1e-5  # float sums in another order, against the magnitude of the row's products
SHAPES = [  # (N, K, rows): the dot-product path, the shared-rows path, the tiled path, the unembedding
    (5120, 2880, 1),
    (2880, 4096, 5),
    (37, 100, 4),  # AVX2: 4 input rows in one pass; 8 as two such passes
    (37, 100, 8),
    (201_088, 2880, 2),
    (4096, 2880, 24),
    (37, 100, 11),
]
PROMPT = REAL_WIDTH_PROMPT
# int8 rows against the bf16 checkpoint, relative to the spread (standard deviation) of the reference's logits
# at each step; measured on this model over the prompt and four answer tokens: at most 0.100 (largest
# difference) and 0.022 (root mean square)
LARGEST, RMS = 0.15, 0.03


@pytest.fixture(scope="module")
def libraries() -> dict[str, str]:
    return kernel_builds()


def test_int8_rows_keep_each_value_within_half_its_rows_step():
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((300, 70)) * np.logspace(-6, 1, 300)[:, None]).astype(ml_dtypes.bfloat16)
    weight[7] = 0
    codes, scales = int8_rows(weight, block_rows=64)
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and np.abs(codes.astype(int)).max() <= 127
    wide = weight.astype(np.float64)
    assert np.all(np.abs(codes * scales[:, None].astype(np.float64) - wide) <= scales[:, None] / 2 * (1 + 1e-6))
    assert np.all(np.abs(codes).max(axis=1)[np.arange(300) != 7] == 127) and scales[7] == 1 and not codes[7].any()


@pytest.mark.parametrize(("n", "k", "rows"), SHAPES, ids=lambda v: str(v))
def test_the_kernel_equals_the_portable_realization_and_the_reference(libraries, n, k, rows, tmp_path):
    rng = np.random.default_rng(n + k + rows)
    codes = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
    scales = rng.uniform(1e-4, 1e-2, size=n).astype(np.float32)
    model = dense_model(codes, tmp_path / "dense.onnx", scales)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    expected, magnitude = np.empty((rows, n)), np.empty((rows, n))
    for start in range(0, n, 16384):  # float64, a block of rows at a time (the unembedding)
        block = codes[start : start + 16384].astype(np.float64) * scales[start : start + 16384, None]
        expected[:, start : start + 16384] = x @ block.T
        magnitude[:, start : start + 16384] = np.abs(x) @ np.abs(block).T
    if n * k < 2**26:  # the portable realization keeps a float32 copy: checked where that is small
        portable = kernel_session(model, None).run(None, {"x": x})[0]
        assert np.all(np.abs(portable - expected) <= RELATIVE * magnitude + 1e-30)
    for name, library in libraries.items():
        got = kernel_session(model, library).run(None, {"x": x})[0]
        assert got.shape == (rows, n) and got.dtype == np.float32
        error = np.abs(got - expected) / (magnitude + 1e-30)
        assert error.max() < RELATIVE, f"{name}: {error.max():.2e}"


def test_a_scale_that_is_not_one_per_row_is_an_error_naming_the_op(libraries, tmp_path):
    model = dense_model(np.zeros((8, 16), np.int8), tmp_path / "dense.onnx", np.ones(7, np.float32))
    with pytest.raises(Exception, match="DenseInt8: scale must be"):
        kernel_session(model, libraries["native"]).run(None, {"x": np.zeros((2, 16), np.float32)})


def test_the_engine_serves_int8_dense_weights_within_the_bound_at_the_real_width(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "wide", REAL_WIDTH, "original")
    cache = tmp_path / "graphs"
    options = EngineOptions(
        checkpoint=str(checkpoint), max_positions=64, max_batch=1, cache_dir=str(cache), device="cpu", dense_int8=True
    )
    tokens = greedy_tokens(options, PROMPT, 4)
    model = compiled_model(Checkpoint(checkpoint), GraphOptions(64, dense_int8=True), cache)  # the backend's graph
    graph = onnx.load(str(model), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    layers = REAL_WIDTH.num_hidden_layers
    assert (ops["DenseInt8"], ops["DenseBF16"], ops["MatMul"]) == (2 * layers + 1, layers, 0)  # the router in bf16
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    assert initializers["unembedding.weight"].data_type == onnx.TensorProto.INT8
    runtime = PagedRunner.create(str(model), REAL_WIDTH, 1, 64, kernels=kernel_library())
    worst, rms = drift_from_reference(runtime, ReferenceModel(checkpoint), PROMPT, tokens, 2 * LARGEST, True)
    assert worst < LARGEST and rms < RMS, f"relative to the logits' spread: largest {worst:.3f}, rms {rms:.3f}"


def test_dense_int8_asked_of_the_cuda_device_is_a_configuration_error():
    with pytest.raises(ValidationError, match="dense_int8 is a CPU option"):
        EngineOptions(device="cuda", dense_int8=True)
