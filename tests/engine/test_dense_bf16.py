"""The DenseBF16 kernel (C++, CPU: bf16 dense weights read as they are, widened exactly) equals its portable
realization (the weight widened to float once, then MatMul) and a float64 reference, at gpt-oss's widths
(the QKV and output projections, the router, the 201,088-row unembedding) for one to many input rows (its
dot-product and its tiled paths, with rows and columns past a full vector or block), in its vectorized and
its portable build."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from engine_fixtures import kernel_builds, kernel_session

from backends.engine.op_models import dense_model

RELATIVE = 1e-5  # float sums in another order, against the magnitude of the row's products
SHAPES = [  # (N, K, rows)
    (5120, 2880, 1),  # QKV at decode
    (2880, 4096, 4),  # the attention output
    (2880, 4096, 8),  # the same at 8 sequences (AVX2: two groups of 4 rows over each block)
    (32, 2880, 9),  # the router, past the dot-product path
    (201_088, 2880, 4),  # the unembedding (AVX2: 4 input rows in one pass)
    (201_088, 2880, 1),  # the unembedding at decode: streams, the last block's asking past the matrix's end
    (37, 100, 3),  # 3 input rows: one pass of 3 weight rows (AVX2), a partial block
    (5120, 2880, 40),  # prefill: five full register groups
    (37, 100, 13),  # a partial block of outputs, K past whole vectors, a partial group of rows
    (37, 100, 5),  # shared passes over weight rows: a partial block whose rows are not whole passes
    (37, 100, 6),  # AVX2: 4 input rows in one pass, then the rest in another
    (37, 100, 7),
    (37, 100, 1),  # one and two rows: K past whole chunks of even and odd values (the decode's bf16 layout)
    (37, 100, 2),
]


@pytest.fixture(scope="module")
def libraries() -> dict[str, str]:
    return kernel_builds()


@pytest.mark.parametrize(("n", "k", "rows"), SHAPES, ids=lambda v: str(v))
def test_the_kernel_equals_the_portable_realization_and_the_reference(libraries, n, k, rows, tmp_path):
    rng = np.random.default_rng(n + k + rows)
    weight = _random_bf16(rng, n, k)
    model = dense_model(weight, tmp_path / "dense.onnx")
    x = rng.standard_normal((rows, k)).astype(np.float32)
    wide = weight.astype(np.float32)
    expected = (x.astype(np.float64) @ wide.T.astype(np.float64)) if n * k < 2**26 else _rows(x, wide, np.float64)
    scale = _rows(np.abs(x), np.abs(wide), np.float64)  # what float rounding is relative to
    if n * k < 2**26:  # the portable realization keeps a float32 copy: checked where that is small
        portable = kernel_session(model, None).run(None, {"x": x})[0]
        assert np.all(np.abs(portable - expected) <= RELATIVE * scale + 1e-30)
    for name, library in libraries.items():
        got = kernel_session(model, library).run(None, {"x": x})[0]
        assert got.shape == (rows, n) and got.dtype == np.float32
        error = np.abs(got - expected) / (scale + 1e-30)
        assert error.max() < RELATIVE, f"{name}: {error.max():.2e}"


def _random_bf16(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Weights of magnitude 2^-8 to 2^-3 and either sign, drawn as bf16 bit patterns (fast at 579M values)."""
    bits = rng.integers(0x3B80, 0x3E00, size=(n, k), dtype=np.uint16) | (
        rng.integers(0, 2, size=(n, k), dtype=np.uint16) << 15
    )
    return bits.view(ml_dtypes.bfloat16)


def _rows(x: np.ndarray, wide: np.ndarray, dtype: type) -> np.ndarray:
    """x . wide^T in `dtype`, a block of weight rows at a time (the unembedding is 2.3 GB as float32)."""
    out = np.empty((x.shape[0], wide.shape[0]), dtype)
    step = 16384
    for start in range(0, wide.shape[0], step):
        out[:, start : start + step] = x.astype(dtype) @ wide[start : start + step].T.astype(dtype)
    return out


def test_a_bad_shape_is_an_error_naming_the_op(libraries, tmp_path):
    model = dense_model(np.zeros((8, 16), ml_dtypes.bfloat16), tmp_path / "dense.onnx")
    with pytest.raises(Exception, match=r"DenseBF16|x"):
        kernel_session(model, libraries["native"]).run(None, {"x": np.zeros((2, 15), np.float32)})
