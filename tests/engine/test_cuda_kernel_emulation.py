"""The CUDA MXFP4 MoE kernel's arithmetic, checked without a GPU: its .cu file itself is compiled as host C++
with a warp-emulation shim (tests/support/kernel_emulation: a thread per CUDA thread, lanes in lockstep at each
shuffle, block barriers) and run against the compiled CPU kernel on the same layers, routing included,
in float32, float16 and bfloat16."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from emulated_kernels import compile_emulated

from backends.engine.config import ModelConfig
from backends.engine.graph import GraphOptions, moe_attributes
from backends.engine.kernels import build, variants
from backends.engine.kernels.moe_tuning import CANDIDATES
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import moe_layer_model

DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
SHAPES = [
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=64), 3),
    # more tokens per expert than one chunk (8)
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=288, intermediate_size=64), 19),
    # rows longer than one round of the warp's lanes (3 x 32 MXFP4 blocks of 32 values), the second partly filled
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=3136, intermediate_size=64), 3),
    # gpt-oss's width (rows of 90 blocks), one token: the batch-1 decode kernels
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=2880, intermediate_size=2880), 1),
    # one token routed among gpt-oss-20b's 32 experts by its top 4 (two output rows per fc2 block)
    (ModelConfig(num_experts=32, experts_per_token=4, hidden_size=64, intermediate_size=96), 1),
    # k = 3: two rows per fc2 block and two idle warps
    (ModelConfig(num_experts=5, experts_per_token=3, hidden_size=96, intermediate_size=64), 1),
]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    directory = tmp_path_factory.mktemp("emulation")
    return compile_emulated(build.MOE_CUDA_SOURCE, "emulation_driver.cc", "gptoss_emulated_moe", directory, "-O1")


def _cpu_kernel(model: Path, dtype: str, x: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """The CPU kernel's float arithmetic: this machine's build without AMX tiles (their prefill sums bf16 pieces)."""
    options = ort.SessionOptions()
    float_only = ("no-amx-tile",) if variants.is_x86() else ()
    options.register_custom_ops_library(str(build.build_library(cuda=False, extensions=float_only)))
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    onnx_type = GraphOptions(16, dtype).onnx_type  # type: ignore[arg-type]
    binding = session.io_binding()
    for name, array in (("x", x), ("router_logits", logits)):
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, onnx_type))
    out = np.zeros_like(x)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, onnx_type))
    session.run_with_iobinding(binding)
    return out


def _widen(raw: np.ndarray, dtype: str) -> np.ndarray:
    return raw if dtype == "float32" else raw.view(GraphOptions(16, dtype).numpy_type).astype(np.float32)  # type: ignore[arg-type]


def _emulated_and_cpu(
    emulated, config, tokens, dtype, tmp_path, gemm_min_tokens, capturing=False, mma_min_tokens=0, variants=None
) -> tuple[np.ndarray, np.ndarray]:
    """The emulated CUDA kernel's output and the CPU kernel's, widened to float32, on a random layer; `variants`:
    a tuned table (GATEWAY_MOE_VARIANTS's text) applied over the thresholds, as the ONNX Runtime op applies it."""
    layer = random_moe_layer(config, seed=tokens)
    numpy_type = GraphOptions(16, dtype).numpy_type  # type: ignore[arg-type]
    rng = np.random.default_rng(tokens)

    def activation(shape: tuple[int, ...], spread: float = 1.0) -> np.ndarray:
        values = (spread * rng.standard_normal(shape)).astype(np.float32).astype(numpy_type)
        return values.view(np.uint16) if dtype != "float32" else values

    x = activation((tokens, config.hidden_size))
    logits = activation((tokens, config.num_experts), 3.0)
    logits[0, :2] = logits[0, 2]  # a tie: the lower expert index wins on both sides
    expected = _widen(_cpu_kernel(moe_layer_model(config, layer, tmp_path, dtype), dtype, x, logits), dtype)

    stored = {n: layer[n].astype(np.float32).astype(numpy_type) for n in ("mlp1_bias", "mlp2_bias")}
    biases = {n: v.view(np.uint16) if dtype != "float32" else v for n, v in stored.items()}
    out = np.zeros_like(x)
    attributes = moe_attributes(config)
    pointer = lambda array: array.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    error = emulated.gptoss_emulated_moe(
        ctypes.c_int64(tokens), ctypes.c_int64(config.hidden_size), ctypes.c_int64(config.intermediate_size),
        ctypes.c_int64(config.num_experts), ctypes.c_int64(config.experts_per_token),
        ctypes.c_float(attributes["swiglu_limit"]), ctypes.c_float(attributes["activation_alpha"]),
        ctypes.c_int(DTYPE_CODES[dtype]), pointer(x), pointer(logits),
        pointer(layer["mlp1_weight.blocks"]), pointer(layer["mlp1_weight.scales"]), pointer(biases["mlp1_bias"]),
        pointer(layer["mlp2_weight.blocks"]), pointer(layer["mlp2_weight.scales"]), pointer(biases["mlp2_bias"]),
        pointer(out), ctypes.c_int64(gemm_min_tokens), ctypes.c_int(capturing), ctypes.c_int64(mma_min_tokens),
        None if variants is None else ctypes.c_char_p(variants.encode()),
    )  # fmt: skip
    assert error is None
    return _widen(out, dtype), expected


@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
@pytest.mark.parametrize(("config", "tokens"), SHAPES, ids=lambda v: getattr(v, "hidden_size", v))
def test_the_cuda_kernel_computes_what_the_cpu_kernel_does(emulated, config, tokens, dtype, tmp_path):
    got, expected = _emulated_and_cpu(emulated, config, tokens, dtype, tmp_path, gemm_min_tokens=0)
    scale = float(np.abs(expected).max())
    assert scale > 0.1
    # float32 sums of up to 3,136 products in another order (2.2e-5 seen); 16-bit outputs may round to the
    # neighbouring value. A wrong block, scale or routing weight is off by far more.
    ulp = {"float32": 5e-5, "float16": 2**-10, "bfloat16": 2**-7}[dtype]
    assert np.all(np.abs(got - expected) <= ulp * np.maximum(np.abs(expected), scale / 64) + 1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("config", "tokens"), [*SHAPES[:2], SHAPES[3]], ids=lambda v: getattr(v, "hidden_size", v))
def test_the_gemm_path_computes_what_the_cpu_kernel_does(emulated, config, tokens, dtype, tmp_path):
    """A prefill's path: tokens gathered by expert, each expert's MXFP4 rows decoded to 16 bits, the GEMMs as
    cuBLAS's cublasGemmEx defines them (column-major, transposed weights), the choices combined."""
    got, expected = _emulated_and_cpu(emulated, config, tokens, dtype, tmp_path, gemm_min_tokens=1)
    scale = float(np.abs(expected).max())
    assert scale > 0.1
    # besides the output's rounding, fc2 reads swiglu's output rounded to 16 bits (the CPU keeps float32): an
    # error of up to half a unit in each of the I products, which cancellation does not shrink with the sum
    ulp = {"float16": 2**-10, "bfloat16": 2**-7}[dtype]
    error = np.abs(got - expected) / (ulp * (np.abs(expected) + scale / 4))
    assert error.max() <= 1.0, f"largest error {error.max():.3f} of the bound"  # 0.50 to 0.67 seen


MMA_SHAPES = [
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=288, intermediate_size=64), 19),
    # a decode batch of 64 among gpt-oss-20b's 32 experts by its top 4 (several tiles of 16 for some experts)
    (ModelConfig(num_experts=32, experts_per_token=4, hidden_size=64, intermediate_size=96), 64),
    # gpt-oss's width on the K of fc1 and the rows of fc2
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=2880, intermediate_size=64), 8),
    # about 50 choices an expert: a pass of two tiles (32 choices), then one of one or two
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=96), 100),
    # gpt-oss's width on both K (fc1's 2,880 and fc2's 2,880: 90 blocks, rounds of 8 with a partial last one)
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=2880, intermediate_size=2880), 9),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("config", "tokens"), MMA_SHAPES, ids=lambda v: getattr(v, "hidden_size", v))
def test_the_tensor_core_path_computes_what_the_cpu_kernel_does(emulated, config, tokens, dtype, tmp_path):
    """A decode batch's path: fc1 and fc2 as mma.sync m16n8k16 tiles (the shim computes each tile from the warp's
    fragments in PTX's layout), the MXFP4 weights decoded into the fragments, the plan and combine the CUDA
    cores'."""
    got, expected = _emulated_and_cpu(emulated, config, tokens, dtype, tmp_path, 0, mma_min_tokens=8)
    _assert_within_rounded_swiglu(got, expected, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(num_experts=32, experts_per_token=4, hidden_size=64, intermediate_size=96),
        # gpt-oss's width: K's 90 blocks in 4 parts of 23, 23, 23 and 21 (a batch-1 step splits K)
        ModelConfig(num_experts=4, experts_per_token=4, hidden_size=2880, intermediate_size=2880),
    ],
    ids=lambda c: c.hidden_size,
)
def test_the_tensor_core_path_takes_a_single_token(emulated, dtype, config, tmp_path):
    """With the tiles from one token (GATEWAY_MOE_MMA_MIN_TOKENS=1, the default), batch-1 decode runs them too,
    K split in parts whose sums are added after (a few choices fill too few blocks otherwise); at the small
    width some parts are empty."""
    got, expected = _emulated_and_cpu(emulated, config, 1, dtype, tmp_path, 0, mma_min_tokens=1)
    _assert_within_rounded_swiglu(got, expected, dtype)
    on_cores = _emulated_and_cpu(emulated, config, 1, dtype, tmp_path / "cores", 0, mma_min_tokens=0)[0]
    assert not np.array_equal(got, on_cores)  # the tiles ran: fc2 read swiglu's output rounded to 16 bits


def _assert_within_rounded_swiglu(got: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    scale = float(np.abs(expected).max())
    assert scale > 0.1
    # as the GEMM path: the inputs rounded to 16 bits for the tiles (fc2's from the float swiglu output)
    ulp = {"float16": 2**-10, "bfloat16": 2**-7}[dtype]
    error = np.abs(got - expected) / (ulp * (np.abs(expected) + scale / 4))
    assert error.max() <= 1.0, f"largest error {error.max():.3f} of the bound"


# gpt-oss's width on fc1's K (2,880: 90 blocks, split into 2, 4 and 8 parts, the last shorter) and fc2's rows
GPT_OSS_WIDTH = ModelConfig(num_experts=4, experts_per_token=2, hidden_size=2880, intermediate_size=64)


@pytest.mark.parametrize("tokens", [1, 5])
def test_every_variant_a_gpu_sweep_times_computes_what_the_cpu_kernel_does(emulated, tokens, tmp_path):
    """Each launch variant the sweep (engine_check --steps sweep) may write into the table, forced for every step
    size through the table's own text, at one token (the batch-1 kernels) and five: within the 16-bit bound of the
    CPU kernel, and the CUDA cores' not the tiles' output (the tiles' split counts and the GEMMs differ from the rule's
    only below bfloat16's rounding)."""
    rule = _emulated_and_cpu(emulated, GPT_OSS_WIDTH, tokens, "bfloat16", tmp_path / "rule", 128, False, 1)[0]
    for variant in CANDIDATES:
        table = f"4096={variant}"
        got, expected = _emulated_and_cpu(
            emulated, GPT_OSS_WIDTH, tokens, "bfloat16", tmp_path / variant.replace("/", ""), 128, False, 1, table
        )
        _assert_within_rounded_swiglu(got, expected, "bfloat16")
        if variant == ("tiles/4" if tokens * 2 <= 8 else "tiles/1"):  # the rule's own choice
            assert np.array_equal(got, rule)
        elif variant == "cores":  # fc2 on the float swiglu output, not rounded to 16 bits as the tiles' input
            assert not np.array_equal(got, rule)


def test_a_table_of_variants_picks_by_step_size_and_leaves_larger_steps_to_the_rule(emulated, tmp_path):
    """`1=cores;4=tiles/2`: one token on the CUDA cores, three on the tiles in two parts, nine past the table
    (the built-in rule: tiles, unsplit); text that is not a table is refused."""
    config, table = SHAPES[1][0], "1=cores;4=tiles/2"
    for tokens, forced in ((1, "4096=cores"), (3, "4096=tiles/2"), (9, "4096=tiles/1")):
        tabled = _emulated_and_cpu(emulated, config, tokens, "bfloat16", tmp_path / f"t{tokens}", 0, False, 1, table)
        alone = _emulated_and_cpu(emulated, config, tokens, "bfloat16", tmp_path / f"f{tokens}", 0, False, 1, forced)
        assert np.array_equal(tabled[0], alone[0])
    with pytest.raises(AssertionError):
        _emulated_and_cpu(emulated, config, 1, "bfloat16", tmp_path / "bad", 0, False, 1, "4=tiles/0")


def test_a_step_captured_into_a_cuda_graph_stays_off_the_gemm_path(emulated, tmp_path):
    """That path waits for the host (the experts' row counts), which a capture cannot: the CUDA-core kernel runs."""
    config, tokens = SHAPES[1]
    runs = {
        name: _emulated_and_cpu(emulated, config, tokens, "bfloat16", tmp_path / name, threshold, capturing, mma)[0]
        for name, threshold, capturing, mma in (
            ("cores", 0, False, 0), ("gemms", 1, False, 0), ("captured", 1, True, 0), ("mma", 0, False, 8),
            ("captured_mma", 1, True, 8),
        )
    }  # fmt: skip
    assert np.array_equal(runs["captured"], runs["cores"]) and not np.array_equal(runs["gemms"], runs["cores"])
    # with the tensor-core tiles on, a captured step of this size runs them instead
    assert np.array_equal(runs["captured_mma"], runs["mma"]) and not np.array_equal(runs["mma"], runs["cores"])


def test_the_emulated_routing_is_a_softmax_over_the_top_k(emulated, tmp_path):
    """Top logits [6.75, 6.03] weigh 0.67 / 0.33 (the old kernel gave 0.0065 / 0.9935)."""
    config = ModelConfig(num_experts=4, experts_per_token=2, hidden_size=32, intermediate_size=32)
    layer = random_moe_layer(config, seed=1)
    x = np.ones((1, 32), np.float32)
    logits = np.array([[6.75, 6.03, -1.0, -2.0]], np.float32)
    attributes = moe_attributes(config)
    pointer = lambda array: array.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    outputs = []
    for routed in (logits, np.array([[6.75, -50.0, -60.0, -70.0]], np.float32),
                   np.array([[-50.0, 6.03, -60.0, -70.0]], np.float32)):  # fmt: skip
        out = np.zeros_like(x)
        biases = [layer[n].astype(np.float32) for n in ("mlp1_bias", "mlp2_bias")]
        assert emulated.gptoss_emulated_moe(
            ctypes.c_int64(1), ctypes.c_int64(32), ctypes.c_int64(32), ctypes.c_int64(4), ctypes.c_int64(2),
            ctypes.c_float(attributes["swiglu_limit"]), ctypes.c_float(attributes["activation_alpha"]), ctypes.c_int(0),
            pointer(x), pointer(routed), pointer(layer["mlp1_weight.blocks"]), pointer(layer["mlp1_weight.scales"]),
            pointer(biases[0]), pointer(layer["mlp2_weight.blocks"]), pointer(layer["mlp2_weight.scales"]),
            pointer(biases[1]), pointer(out), ctypes.c_int64(0), ctypes.c_int(0), ctypes.c_int64(0), None,
        ) is None  # fmt: skip
        outputs.append(out)
    first = 1 / (1 + np.exp(6.03 - 6.75))
    # with one expert dominating, the output is that expert's alone; mixed, it is the weighted sum
    np.testing.assert_allclose(outputs[0], first * outputs[1] + (1 - first) * outputs[2], rtol=1e-4, atol=1e-5)
    assert abs(first - 0.6726) < 1e-3
