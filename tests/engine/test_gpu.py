"""The engine on CUDA, wherever onnxruntime's CUDA provider runs (elsewhere these tests are skipped, and the
skip says why): the CUDA MXFP4MoE kernel against the CPU kernel at gpt-oss's width on both of its paths,
and the decoder on CUDA (MoE by our kernel or by ONNX Runtime's QMoE) against the CPU float32 decoder, and the
sampler kernel on CUDA against the CPU one.
`pytest -m gpu` runs just these; the kernel library is GATEWAY_ENGINE_KERNELS's where set (a library built
elsewhere with nvcc), else built here."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from paths import ROOT

from backends.engine.config import ModelConfig
from backends.engine.graph import GraphOptions
from backends.engine.kernels import attention_tuning, moe_tuning
from backends.engine.kernels.build import kernel_library
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import moe_layer_model
from backends.engine.runtime import cuda_unavailable_reason

sys.path.insert(0, str(ROOT / "bench"))
from engine_check import layer_inputs, layer_session, parity, run_layer
from kernel_session import kernel_session

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
LAYER = ModelConfig(num_experts=8, experts_per_token=4, hidden_size=2880, intermediate_size=2880)
ULP = {"float32": 5e-5, "float16": 2**-10, "bfloat16": 2**-7}


@pytest.fixture(scope="module")
def kernels() -> Path:
    reason = cuda_unavailable_reason(0) if DEVICE == "cuda" else None
    if reason is not None:
        pytest.skip(f"needs onnxruntime's CUDA provider: {reason}")
    library = kernel_library()
    assert library is not None, "no kernel library (set GATEWAY_ENGINE_KERNELS to one built with nvcc)"
    return library


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_cuda_moe_kernel_computes_what_the_cpu_kernel_does_on_both_paths(kernels, dtype, tmp_path):
    model = moe_layer_model(LAYER, random_moe_layer(LAYER, seed=5), tmp_path, dtype)
    cpu, device = layer_session(model, kernels, "cpu"), layer_session(model, kernels, DEVICE)
    cores = layer_session(model, kernels, DEVICE, gemm_min_tokens=0, mma_min_tokens=0)
    tiles = layer_session(model, kernels, DEVICE, mma_min_tokens=1)  # the tensor-core tiles at every size
    options = GraphOptions(16, dtype)  # type: ignore[arg-type]
    for tokens in (1, 3, 64, 256):  # up to 127: decode steps, on the tiles; 256: a prefill's step, on the GEMMs
        x, logits = layer_inputs(tokens, LAYER, options)
        expected, got = run_layer(cpu, x, logits, options), run_layer(device, x, logits, options)
        scale = float(np.abs(expected).max())
        sixteen_bit = dtype != "float32"
        rounded = sixteen_bit  # the tiles at every decode size, the GEMMs from 128 tokens
        # both round swiglu's output to 16 bits before fc2 (see test_cuda_kernel_emulation.py)
        room = scale / 4 if rounded else scale / 64
        error = np.abs(got - expected) / (ULP[dtype] * (np.abs(expected) + room))
        assert error.max() <= 1.0, (tokens, float(error.max()))
        if sixteen_bit:
            on_tiles = run_layer(tiles, x, logits, options)
            tile_error = np.abs(on_tiles - expected) / (ULP[dtype] * (np.abs(expected) + scale / 4))
            assert tile_error.max() <= 1.0, ("tiles", tokens, float(tile_error.max()))
        if rounded:  # it did run: the CUDA-core kernel's output differs in its rounding
            assert not np.array_equal(got, run_layer(cores, x, logits, options))


@pytest.mark.parametrize("variant", moe_tuning.CANDIDATES)
def test_every_launch_variant_a_sweep_may_choose_computes_what_the_cpu_kernel_does(kernels, variant, tmp_path):
    """Each variant forced for every step size (GATEWAY_MOE_VARIANTS), at a decode step of 1 and 3 tokens and
    a prefill's of 256, in bfloat16; and the GPU is one the driver names, as the tuning table keys it."""
    gpu = moe_tuning.cuda_gpu(0)
    assert gpu is not None and gpu.name and gpu.capability.replace(".", "").isdigit()
    model = moe_layer_model(LAYER, random_moe_layer(LAYER, seed=5), tmp_path, "bfloat16")
    cpu = layer_session(model, kernels, "cpu")
    forced = kernel_session(model, kernels, DEVICE, {moe_tuning.VARIANTS_ENV: f"4096={variant}"})
    options = GraphOptions(16, "bfloat16")
    for tokens in (1, 3, 256):
        x, logits = layer_inputs(tokens, LAYER, options)
        expected, got = run_layer(cpu, x, logits, options), run_layer(forced, x, logits, options)
        room = float(np.abs(expected).max()) / 4  # swiglu's output rounded to 16 bits (the cores keep it float)
        error = np.abs(got - expected) / (ULP["bfloat16"] * (np.abs(expected) + room))
        assert error.max() <= 1.0, (variant, tokens, float(error.max()))


@pytest.fixture(scope="module")
def parity_report(kernels, tmp_path_factory) -> dict:
    """bench/engine_check.py's parity step: a 150-token prompt (past the window, and on the GEMM path), then 100
    greedy steps, on CUDA in float16 and bfloat16 with each MoE realization, against the CPU float32 decoder."""
    return parity(tmp_path_factory.mktemp("parity"), DEVICE, kernels, cuda_graph=False)


@pytest.mark.parametrize("moe", ["mxfp4moe", "qmoe"])
def test_the_decoder_on_cuda_follows_the_cpu_float32_decoder(parity_report, moe):
    """Fed the CPU's tokens, the device picks the same token at every step but near ties, and its prompt
    logits lie within a share of their scale (float16 0.5%, bfloat16 3%); with our MXFP4MoE kernel and with
    ONNX Runtime's QMoE (the engine's `moe` qmoe)."""
    report = parity_report
    for dtype, tolerance in (("float16", 0.005), ("bfloat16", 0.03)):
        row = report[dtype if moe == "mxfp4moe" else f"{moe}_{dtype}"]
        assert "error" not in row, row
        assert row["disagreements_beyond_a_near_tie"] == 0, row
        assert row["prompt_logits_max_abs_diff"] <= tolerance * report["logit_scale"], row


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefix_copied_between_kv_slots_on_the_device_continues_as_the_original(kernels, dtype, tmp_path):
    """The prefix cache's sharing: a sequence holds another's full pages by reference and a device-to-device copy
    of its partly shared page (copy-on-write), and its prefill of the rest then gives the logits the source's
    whole prefill gave."""
    copied_prefix_differences(DEVICE, dtype, kernels, tmp_path, limit=1e-5 if dtype == "float32" else 5e-3)


def copied_prefix_differences(device: str, dtype: str, kernels: Path, directory: Path, limit: float) -> None:
    from engine_fixtures import make_checkpoint, tiny_config

    from backends.engine.checkpoint import Checkpoint
    from backends.engine.model_cache import compiled_model
    from backends.engine.paged_runner import PagedRunner

    config = tiny_config()
    model = compiled_model(
        Checkpoint(make_checkpoint(directory / "model", config, "original")),
        GraphOptions(256, dtype, dense_bf16=device == "cpu"),  # type: ignore[arg-type]
        directory / "graphs",
    )
    runtime = PagedRunner.create(str(model), config, 3, 256, kernels=kernels, device=device, dtype=dtype)  # type: ignore[arg-type]
    prompt = [200006, 17360, 200008, *range(3000, 3150)]  # past the 128-position window
    whole = runtime.prefill(0, prompt)
    kept = 133
    runtime.share_prefix(0, 2, kept)
    rest = runtime.prefill(2, prompt[kept:], kept)
    step = runtime.decode([(0, 77, len(prompt)), (2, 77, len(prompt))])
    for expected, got in ((whole, rest), (step[0], step[2])):
        assert np.abs(got - expected).max() <= limit * max(1.0, float(np.abs(expected).max()))


def test_the_cuda_sampler_chooses_what_the_cpu_kernel_does(kernels):
    """SampleTokens on CUDA (the logits on the device, bound in place) against the CPU kernel at the real
    vocabulary, on rows of every kind (bench/sampler_bench.py's kinds and the emulation test's mixed rows)."""
    import onnxruntime as ort
    from test_sample_tokens import _logits, _mixed_rows

    from backends.engine.sampling_session import SamplingSession

    logits = _logits(24, 5)
    rows = _mixed_rows(logits, 13)
    host = ort.OrtValue.ortvalue_from_numpy(logits)
    device = ort.OrtValue.ortvalue_from_numpy(logits, DEVICE, 0)
    cpu = SamplingSession(kernels, ["CPUExecutionProvider"], ("cpu", 0), host).sample(rows)
    providers = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    cuda = SamplingSession(kernels, providers, (DEVICE, 0), device).sample(rows)
    assert cuda.tokens.tolist() == cpu.tokens.tolist()  # expf may differ by an ulp: a flip needs a near tie
    np.testing.assert_allclose(cuda.logprob, cpu.logprob, atol=1e-5)
    assert cuda.top_ids.tolist() == cpu.top_ids.tolist()


def test_attention_on_the_tensor_cores_matches_the_cuda_core_kernels(kernels, tmp_path):
    """AttendMma against AttendTiles and DecodeMma against Attend on the device (bf16, gpt-oss's heads): a prompt
    from position 0, a chunk deep in a long context, decode rows whose keys are split in parts, each in a window
    layer too, and a ragged block end (tokens not a multiple of 16)."""
    from attention_layer import Case, attention_timing

    from backends.engine.config import GPT_OSS_20B

    cases = (
        Case("prompt_300", 300, 0, 0),
        Case("prompt_300_window", 300, 0, 128),
        Case("chunk_77_at_5000", 77, 5000, 0),
        Case("chunk_77_at_5000_window", 77, 5000, 128),
        Case("decode_5_at_5000", 5, 5000, 0, decode=True),
        Case("decode_5_at_5000_window", 5, 5000, 128, decode=True),
    )
    report = attention_timing(GPT_OSS_20B, tmp_path, kernels, DEVICE, cases)
    for name, row in report.items():
        assert row["max_diff_relative"] < 2e-2, (name, row)


@pytest.mark.parametrize("keys", attention_tuning.CANDIDATES)
def test_every_attention_split_a_sweep_may_choose_computes_what_the_default_does(kernels, keys, tmp_path):
    """A decode step of 5 rows at 8,192 positions (bf16, gpt-oss's heads; a full and a window layer) with its keys
    split as GATEWAY_ATTENTION_SPLITS forces, against the default split of 1,024 keys a part."""
    from attention_layer import attention_model
    from attention_sweep import EVERY_ROWS, DecodeStep, shared_caches
    from onnx import TensorProto

    from backends.engine.config import GPT_OSS_20B

    context = 8192
    for window in (0, GPT_OSS_20B.sliding_window):
        model = tmp_path / f"attention-{window}.onnx"
        model.write_bytes(attention_model(GPT_OSS_20B, window, TensorProto.BFLOAT16, context))
        outputs = []
        for split in (1024, keys):
            session = kernel_session(model, kernels, DEVICE, {attention_tuning.SPLITS_ENV: f"{EVERY_ROWS}={split}"})
            step = DecodeStep(GPT_OSS_20B, DEVICE, shared_caches(GPT_OSS_20B, DEVICE, 5 * context), context, 5, context)
            outputs.append(step.time(session)[1])
        reference, output = outputs
        assert np.abs(output - reference).max() <= 2e-2 * np.abs(reference).max(), (window, keys)
