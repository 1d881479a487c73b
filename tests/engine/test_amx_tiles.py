"""The x86-64-v4-amx variant: prefill's MoE experts and bf16 projections on Intel AMX tiles, the inputs in two
bfloat16 pieces. Checked where the CPU has the tiles (else named as skipped): at gpt-oss-20b's width, within the
float64 reference's bounds the AVX-512 kernels meet, in an arithmetic of its own (the tiles ran, not a fallback),
and the same as the AVX-512 build where the tiles are turned off (GATEWAY_CPU_AMX=0) or the step decodes."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from engine_fixtures import kernel_session

from backends.engine.config import GPT_OSS_20B
from backends.engine.kernels import build
from backends.engine.kernels.variants import X86_VARIANTS, cpu_flags, runs_here
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import dense_model, moe_layer_model

AMX = next(variant for variant in X86_VARIANTS if variant.name == "x86-64-v4-amx")
VNNI = next(variant for variant in X86_VARIANTS if variant.name == "x86-64-v4-vnni")
pytestmark = pytest.mark.skipif(
    not runs_here(AMX), reason=f"x86-64-v4-amx: this CPU lacks {', '.join(sorted(AMX.needs - cpu_flags()))}"
)
MOE_RELATIVE = 1e-5  # of the output's magnitude (tests/engine/test_engine_kernels.py's bound)
DENSE_RELATIVE = 1e-5  # against the magnitude of the row's products (tests/engine/test_dense_bf16.py's bound)


def _library(variant) -> str:
    return str(build.build_library(march=variant.march, cuda=False, extensions=variant.extensions))


def test_the_moe_prefill_on_tiles_is_within_the_float_bound_at_the_real_width(tmp_path):
    layer = random_moe_layer(GPT_OSS_20B, seed=3)
    rng = np.random.default_rng(3)
    tokens = 48  # about six a routed expert: the tiled path (four or more), a block of 16 part full
    feeds = {
        "x": rng.standard_normal((tokens, GPT_OSS_20B.hidden_size)).astype(np.float32),
        "router_logits": rng.standard_normal((tokens, GPT_OSS_20B.num_experts)).astype(np.float32),
    }
    model = moe_layer_model(GPT_OSS_20B, layer, tmp_path)
    expected = kernel_session(model, None).run(None, feeds)[0]  # the pure-ONNX realization, float32
    on_tiles = kernel_session(model, _library(AMX)).run(None, feeds)[0]
    in_avx512 = kernel_session(model, _library(VNNI)).run(None, feeds)[0]
    magnitude = float(np.abs(expected).max())
    for name, got in (("amx", on_tiles), ("avx512", in_avx512)):
        worst = float(np.abs(got - expected).max())
        assert worst <= MOE_RELATIVE * magnitude, f"{name}: {worst:.2e} of {magnitude:.2e}"
    assert not np.array_equal(on_tiles, in_avx512)  # bfloat16 pieces summed on tiles: not the float path


def test_bf16_projections_in_prefill_on_tiles_are_within_the_float_bound(tmp_path):
    rng = np.random.default_rng(5)
    n, k, rows = 160, 2880, 40  # five blocks of 32 outputs, three blocks of 16 input rows (the last part full)
    bits = rng.integers(0x3B80, 0x3E00, size=(n, k), dtype=np.uint16) | (
        rng.integers(0, 2, size=(n, k), dtype=np.uint16) << 15
    )
    weight = bits.view(ml_dtypes.bfloat16)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    model = dense_model(weight, tmp_path / "dense.onnx")
    wide = weight.astype(np.float64)
    expected = x.astype(np.float64) @ wide.T
    scale = np.abs(x).astype(np.float64) @ np.abs(wide).T
    on_tiles = kernel_session(model, _library(AMX)).run(None, {"x": x})[0]
    in_avx512 = kernel_session(model, _library(VNNI)).run(None, {"x": x})[0]
    for name, got in (("amx", on_tiles), ("avx512", in_avx512)):
        error = float((np.abs(got - expected) / scale).max())
        assert error < DENSE_RELATIVE, f"{name}: {error:.2e}"
    assert not np.array_equal(on_tiles, in_avx512)
    decode = x[:4]  # a decode step's rows: the dot-product path in both builds, the same code
    assert np.array_equal(
        kernel_session(model, _library(AMX)).run(None, {"x": decode})[0],
        kernel_session(model, _library(VNNI)).run(None, {"x": decode})[0],
    )


def test_gateway_cpu_amx_0_turns_the_tiles_off(tmp_path):
    """In a process started with GATEWAY_CPU_AMX=0 the AMX build computes what the AVX-512 build does."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((64, 128)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((24, 128)).astype(np.float32)
    model = dense_model(weight, tmp_path / "dense.onnx")
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys, numpy as np\n"
        "sys.path[:0] = [sys.argv[4], sys.argv[5]]\n"
        "from engine_fixtures import kernel_session\n"
        "out = kernel_session(sys.argv[1], sys.argv[2]).run(None, {'x': np.load(sys.argv[3])})[0]\n"
        "np.save(sys.argv[3] + '.out.npy', out)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    support = os.path.join(root, "tests", "support")
    subprocess.run(
        [sys.executable, "-c", code, str(model), _library(AMX), str(tmp_path / "x.npy"), root, support],
        check=True,
        env={**os.environ, "GATEWAY_CPU_AMX": "0"},
        timeout=300,
    )
    off = np.load(tmp_path / "x.npy.out.npy")
    assert np.array_equal(off, kernel_session(model, _library(VNNI)).run(None, {"x": x})[0])
    assert not np.array_equal(off, kernel_session(model, _library(AMX)).run(None, {"x": x})[0])
