"""The compiled MXFP4 MoE kernel (C++, CPU) equals the pure-ONNX realization on random layers of several
shapes, a 20b-shaped one included, in its vectorized and its portable build; the engine uses it in
place of the pure-ONNX MoE with the same results; and without it the engine falls back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from engine_fixtures import export_model, kernel_builds, kernel_session, make_checkpoint, tiny_config

from backends.engine.config import GPT_OSS_20B, ModelConfig
from backends.engine.graph import GraphOptions
from backends.engine.kernels import build
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import moe_layer_model
from backends.engine.paged_runner import PagedRunner
from gateway.cli import main

RELATIVE = 1e-5  # fp32 sums in another order: measured below 1e-6 of the output's magnitude
SHAPES = [
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=64), 5),
    (ModelConfig(num_experts=8, experts_per_token=4, hidden_size=128, intermediate_size=96), 17),
    (ModelConfig(num_experts=16, experts_per_token=4, hidden_size=256, intermediate_size=256), 64),
    (GPT_OSS_20B, 1),
    (GPT_OSS_20B, 3),
    (GPT_OSS_20B, 64),  # prefill at the real width: experts with 4 and more tokens, partial groups of six
]


@pytest.fixture(scope="module")
def libraries() -> dict[str, str]:
    return kernel_builds()


@pytest.mark.parametrize(("config", "tokens"), SHAPES, ids=lambda v: getattr(v, "hidden_size", v))
def test_the_kernel_equals_the_pure_onnx_realization(libraries, config, tokens, tmp_path):
    model = moe_layer_model(config, random_moe_layer(config, seed=tokens), tmp_path)
    rng = np.random.default_rng(tokens)
    feeds = {
        "x": rng.standard_normal((tokens, config.hidden_size)).astype(np.float32),
        "router_logits": rng.standard_normal((tokens, config.num_experts)).astype(np.float32),
    }
    expected = kernel_session(model, None).run(None, feeds)[0]
    assert np.abs(expected).max() > 0.1
    for name, library in libraries.items():
        got = kernel_session(model, library).run(None, feeds)[0]
        worst = float(np.abs(got - expected).max())
        assert worst <= RELATIVE * float(np.abs(expected).max()), f"{name}: largest difference {worst:.2e}"


def test_a_step_s_output_does_not_depend_on_the_steps_before_it(libraries, tmp_path):
    """The kernel keeps its buffers from one call to the next on a thread, and releases those that a step grew past
    128 MiB (here 1,024 tokens of 20b's width): a decode step's and a prefill's outputs are the same, bit for bit,
    whatever ran before them, on int8 activations in the native and the AVX2 builds, and in float (the step that
    grows the buffers on int8 activations only: a 1,024-token float step takes seconds on 2 cores)."""
    config = GPT_OSS_20B
    layer = random_moe_layer(config, seed=5)
    rng = np.random.default_rng(5)
    steps = {
        tokens: {
            "x": rng.standard_normal((tokens, config.hidden_size)).astype(np.float32),
            "router_logits": rng.standard_normal((tokens, config.num_experts)).astype(np.float32),
        }
        for tokens in (3, 40, 1024)
    }
    builds = {name: libraries[name] for name in ("native", "x86-64-v3") if name in libraries}
    for pieces, order in ((2, (1024, 3, 40, 3, 1024, 40)), (0, (40, 3, 40))):
        model = moe_layer_model(config, layer, tmp_path, int8_activations=pieces)
        for name, library in builds.items():
            session = kernel_session(model, library)
            first = {tokens: session.run(None, steps[tokens])[0] for tokens in (3, 40)}
            for tokens in order:
                got = session.run(None, steps[tokens])[0]
                assert np.isfinite(got).all(), (name, pieces, tokens)
                if tokens in first:
                    assert np.array_equal(got, first[tokens]), f"{name}, {pieces} pieces: {tokens} tokens differ"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_kernel_in_16_bit_activations_equals_its_float32_result_rounded(libraries, dtype, tmp_path):
    """fp16/bf16 inputs are widened exactly, the sums are float32, the output is rounded once."""
    config, tokens = ModelConfig(num_experts=8, experts_per_token=4, hidden_size=128, intermediate_size=96), 9
    layer = random_moe_layer(config, seed=3)
    wide = moe_layer_model(config, layer, tmp_path, "float32")
    narrow = moe_layer_model(config, layer, tmp_path, dtype)
    numpy_type = GraphOptions(16, dtype).numpy_type
    rng = np.random.default_rng(5)
    x = rng.standard_normal((tokens, config.hidden_size)).astype(numpy_type)
    logits = rng.standard_normal((tokens, config.num_experts)).astype(numpy_type)
    biases = {name: layer[name].astype(np.float32).astype(numpy_type) for name in ("mlp1_bias", "mlp2_bias")}
    assert (
        all(np.array_equal(biases[n].astype(np.float32), layer[n].astype(np.float32)) for n in biases)
        or dtype == "float16"
    )
    expected = kernel_session(wide, libraries["native"]).run(
        None, {"x": x.astype(np.float32), "router_logits": logits.astype(np.float32)}
    )[0]
    onnx_type = GraphOptions(16, dtype).onnx_type
    session = kernel_session(narrow, libraries["native"])
    binding = session.io_binding()  # 16-bit values as raw bits (NumPy has no bfloat16 ONNX Runtime knows)
    for name, array in (("x", x), ("router_logits", logits)):
        binding.bind_ortvalue_input(
            name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), onnx_type)
        )
    out = np.zeros((tokens, config.hidden_size), np.uint16)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, onnx_type))
    session.run_with_iobinding(binding)
    got = out.view(numpy_type)
    # one rounding of the float32 result (fp16 biases are rounded too: allow their effect)
    tolerance = (2**-8 if dtype == "bfloat16" else 2**-10) * np.abs(expected) + (0.0 if dtype == "bfloat16" else 1e-3)
    assert np.all(np.abs(got.astype(np.float32) - expected) <= tolerance + 1e-6)


def test_the_engine_with_the_kernel_decodes_as_without_it(libraries, tmp_path):
    config = tiny_config()
    model = export_model(make_checkpoint(tmp_path, config, "hf"), 256)
    plain = PagedRunner.create(model, config, 1, 256)
    compiled = PagedRunner.create(model, config, 1, 256, kernels=libraries["native"])
    prompt = list(range(3000, 3040))
    a, b = plain.prefill(0, prompt), compiled.prefill(0, prompt)
    worst, tokens = float(np.abs(a - b).max()), []
    for position in range(len(prompt), len(prompt) + 60):
        assert int(np.argmax(a)) == int(np.argmax(b))
        tokens.append(int(np.argmax(a)))
        a, b = plain.decode([(0, tokens[-1], position)])[0], compiled.decode([(0, tokens[-1], position)])[0]
        worst = max(worst, float(np.abs(a - b).max()))
    assert worst < 1e-4 and len(set(tokens)) > 5


def test_the_cuda_kernel_is_compiled_into_the_library(libraries):
    """No GPU here: the CUDA op is compiled for sm_80 and sm_90 and registers; sessions use the CPU op."""
    library = Path(libraries["native"])
    manifest = json.loads((library.parent / build.MANIFEST).read_text())
    assert manifest["cuda"] and manifest["cuda_archs"] == ["sm_80", "sm_90"]
    assert b".nv_fatbin" in library.read_bytes()
    assert any(tool.startswith("nvcc 13.") for tool in manifest["tools"])


def test_without_the_kernels_the_engine_says_why_and_falls_back(monkeypatch, tmp_path):
    build.kernel_choice.cache_clear()
    monkeypatch.setenv(build.KERNELS_ENV, "0")
    assert build.kernel_library() is None
    build.kernel_choice.cache_clear()
    monkeypatch.setenv(build.KERNELS_ENV, str(tmp_path / "absent.so"))
    assert build.kernel_library() is None
    build.kernel_choice.cache_clear()
    prebuilt = build.build_library()
    monkeypatch.setenv(build.KERNELS_ENV, str(prebuilt))  # as the container images set it
    assert build.kernel_library() == prebuilt
    monkeypatch.delenv(build.KERNELS_ENV)
    monkeypatch.setenv(build.HEADERS_ENV, str(build.headers_dir(build.default_cache_dir())))  # no new download
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(build.KernelBuildError, match="the kernel build failed"):
        build.build_library(tmp_path)
    build.kernel_choice.cache_clear()
    assert build.kernel_library(tmp_path) is None  # logged once as engine_kernels_unavailable
    monkeypatch.delenv("CXX")
    monkeypatch.setenv(build.HEADERS_ENV, str(tmp_path))
    with pytest.raises(build.KernelBuildError, match=build.HEADERS_ENV):
        build.build_library(tmp_path / "other")
    build.kernel_choice.cache_clear()


def test_build_kernels_copies_a_library_that_registers(tmp_path, capsys):
    assert main(["build-kernels", "--output", str(tmp_path / "kernels")]) == 0
    library = Path(capsys.readouterr().out.strip())
    assert library.parent == tmp_path / "kernels" and (library.parent / build.MANIFEST).is_file()
    config = ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=64)
    model = moe_layer_model(config, random_moe_layer(config), tmp_path)
    feeds = {"x": np.ones((2, 64), np.float32), "router_logits": np.zeros((2, 4), np.float32)}
    assert kernel_session(model, str(library)).run(None, feeds)[0].shape == (2, 64)


def test_a_first_build_is_announced_and_a_cached_one_is_silent(monkeypatch, tmp_path):
    from structlog.testing import capture_logs

    monkeypatch.delenv(build.HEADERS_ENV, raising=False)
    monkeypatch.setattr(
        build,
        "_download_headers",
        lambda target: (target.mkdir(parents=True), (target / "onnxruntime_cxx_api.h").write_text("")),
    )
    monkeypatch.setattr(build, "_compile_and_link", lambda *args: args[-1].write_bytes(b"library"))
    with capture_logs() as first:
        built = build.build_library(tmp_path)
    assert [e["event"] for e in first] == ["engine_headers_fetching", "engine_kernels_building", "engine_kernels_built"]
    with capture_logs() as again:
        assert build.build_library(tmp_path) == built
    assert again == []
