"""The MoE kernel's int8 paths, the engine's `moe_activations` option on the CPU: experts with fewer than four
tokens in a step (decode), and in x86 builds with AVX2 or AVX-512 those with more (prefill: the integer tiles, where
AMX tiles do not run), take integer dot products of their inputs quantized to int8 per 32 values (step s = max|x| /
127, rounded to nearest even; with `int8x2` also each remainder x - q s, taken with one rounding, in steps of s / 254)
against twice each E2M1 value, scaled by half the block's E8M0 scale times the input block's scale. The kernel, in
its vectorized (VNNI, AVX-512 or AVX2) and portable builds, equals a NumPy emulation of that arithmetic (and differs
from the float path by far more) on layers whose experts take both paths; served at the real width, the logits stay
within a stated bound of the NumPy reference of the checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fixtures import REAL_WIDTH, REAL_WIDTH_PROMPT, greedy_tokens, kernel_builds, kernel_session, make_checkpoint
from engine_reference import ReferenceModel, drift_from_reference
from pydantic import ValidationError

from backends.engine.backend import EngineOptions, moe_activations
from backends.engine.checkpoint import Checkpoint
from backends.engine.config import GPT_OSS_20B, ModelConfig
from backends.engine.graph import SWIGLU_ALPHA, GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.kernels.variants import X86_VARIANTS, runs_here
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.model_cache import compiled_model
from backends.engine.op_models import moe_layer_model
from backends.engine.paged_runner import PagedRunner

AMX = next(variant for variant in X86_VARIANTS if variant.name == "x86-64-v4-amx")

TWICE_E2M1 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int64)
INT8_BELOW = 4  # experts with fewer tokens than this take the decode's int8 path, the others (tiles) as the build does
SHAPES = [  # (config, tokens): decode at the real width; prefill at the real width; mixed paths; a hidden width the
    # int8 paths cannot pair
    (GPT_OSS_20B, 1),
    (GPT_OSS_20B, 3),
    (GPT_OSS_20B, 40),
    (ModelConfig(num_experts=8, experts_per_token=4, hidden_size=128, intermediate_size=128), 9),
    (ModelConfig(num_experts=4, experts_per_token=2, hidden_size=96, intermediate_size=64), 2),
]
# the emulation's float64 sums against the kernel's float32 ones, of the output's magnitude, largest and root mean
# square. An fc2 input within a float rounding of a quantization step's midpoint may round one way in the kernel (its
# fc1 sums float32) and the other in the emulation: one step of one value, which at 40 tokens, where many values are
# quantized, moved an output by up to 9.3e-5 of the magnitude with one piece (1.8e-4 in the portable build; 5.5e-6
# with two), 6e-6 in root mean square (measured; with fewer tokens below 4.3e-6 and 1e-6)
EMULATION_LARGEST, EMULATION_RMS = 4e-4, 2e-5
# the int8 path ran: the float path's root mean square difference from the emulation is this many times the
# kernel's at least (measured 12x to 30x with two pieces, above 70x with one)
FLOAT_FURTHER = 5
# against the bf16 checkpoint's reference, relative to the spread (standard deviation) of its logits at each
# decode step (this prompt's prefill routes four and more tokens to each expert: the integer tiles where the build
# has them); measured on this model over four answer tokens: at most 0.078 (largest difference) and 0.016 (root
# mean square) on an AVX-512 machine (0.074 and 0.016 with the prefill in float)
LARGEST, RMS = 0.11, 0.025
# two pieces (int8x2), the same measure: 0.00030 and 0.000065 measured, a 250th of one piece's
X2_BOUNDS = (0.0012, 0.00025)


REMAINDER_STEPS = 254


def _quantized(values: np.ndarray, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """[K] float32 → int8 codes [K/32, 32] (as int64; two pieces: 254 x the values' plus the remainders') and their
    scales [K/32], rounded as the kernel rounds (float32 arithmetic; the remainder x - q s in float64, exact, then
    rounded once, as a fused multiply-add)."""
    blocks = values.astype(np.float32).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    step = (amax / np.float32(127)).astype(np.float32)
    codes = np.rint(blocks * inverse[:, None])
    if pieces == 1:
        return codes.astype(np.int64), step.astype(np.float64)
    remainders = (blocks.astype(np.float64) - codes.astype(np.float64) * step[:, None]).astype(np.float32)
    rest = np.clip(np.rint(remainders * (inverse * np.float32(REMAINDER_STEPS))[:, None]), -127, 127)
    combined = REMAINDER_STEPS * codes.astype(np.int64) + rest.astype(np.int64)
    return combined, (step / np.float32(REMAINDER_STEPS)).astype(np.float64)


def _dots(blocks: np.ndarray, scales: np.ndarray, vectors: np.ndarray, pieces: int) -> np.ndarray:
    """Rows (blocks [N, G, 16], scales [N, G]) . vectors [T, K] → [T, N], in int8 arithmetic (`pieces` of each
    value: each block's integer sums exact in float64) or in float."""
    twice = np.stack([TWICE_E2M1[blocks & 0x0F], TWICE_E2M1[blocks >> 4]], axis=-1).reshape(*blocks.shape[:-1], 32)
    block_scale = np.exp2(scales.astype(np.float64) - 127) * 0.5
    if pieces:
        quantized = [_quantized(vector, pieces) for vector in vectors]
        codes = np.stack([q for q, _ in quantized]).astype(np.float64)  # [T, G, 32]
        steps = np.stack([step for _, step in quantized])  # [T, G]
        sums = np.matmul(twice.transpose(1, 0, 2).astype(np.float64), codes.transpose(1, 2, 0))  # [G, N, T]
        return np.einsum("gnt,ng,tg->tn", sums, block_scale, steps)
    weights = twice * block_scale[..., None]
    return vectors.astype(np.float64) @ weights.reshape(blocks.shape[0], -1).T


def _emulated(
    config: ModelConfig, layer: dict[str, np.ndarray], x: np.ndarray, logits: np.ndarray, pieces: int, tiles: bool
) -> np.ndarray:
    """The layer's output in float64, experts with fewer than INT8_BELOW tokens on `pieces` int8 pieces, the others
    too where `tiles` (the build's integer tiles), else in float."""
    k, inter, hidden = config.experts_per_token, config.intermediate_size, config.hidden_size
    limit = config.swiglu_limit
    chosen = [np.argsort(-row, kind="stable")[:k] for row in logits]
    out = np.zeros(x.shape, np.float64)
    for expert in range(config.num_experts):
        tokens = [t for t, experts in enumerate(chosen) if expert in experts]
        if not tokens:
            continue
        int8 = len(tokens) < INT8_BELOW or tiles
        up = _dots(layer["mlp1_weight.blocks"][expert], layer["mlp1_weight.scales"][expert], x[tokens],
                   pieces if int8 and hidden % 64 == 0 else 0) + layer["mlp1_bias"][expert]  # fmt: skip
        glu, linear = np.minimum(up[:, 0::2], limit), np.clip(up[:, 1::2], -limit, limit)
        activated = (glu / (1 + np.exp(-SWIGLU_ALPHA * glu)) * (linear + 1)).astype(np.float32)
        down = _dots(layer["mlp2_weight.blocks"][expert], layer["mlp2_weight.scales"][expert], activated,
                     pieces if int8 and inter % 64 == 0 else 0) + layer["mlp2_bias"][expert]  # fmt: skip
        for row, t in enumerate(tokens):
            experts = chosen[t]
            gates = np.exp(logits[t, experts].astype(np.float64) - logits[t, experts].max())
            out[t] += gates[list(experts).index(expert)] / gates.sum() * down[row]
    return out


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values, dtype=np.float64))))


def _integer_tiles(name: str) -> bool:
    """Whether a build's experts with many tokens take the integer tiles: every x86 build with AVX2 (all but the
    portable x86-64), except where the AMX tiles run."""
    return name != "x86-64" and name != "x86-64-v4-amx" and not (name == "native" and runs_here(AMX))


@pytest.fixture(scope="module")
def libraries() -> dict[str, str]:
    """The native build and every variant this CPU runs: with AVX-512 VNNI, AVX-512's byte multiply-adds, AVX2's
    (x86-64-v3) and the portable C++ (x86-64)."""
    return kernel_builds()


@pytest.mark.parametrize("pieces", [1, 2], ids=["int8", "int8x2"])
@pytest.mark.parametrize(("config", "tokens"), SHAPES, ids=lambda v: str(getattr(v, "hidden_size", v)))
def test_the_int8_path_equals_its_emulation(libraries, config, tokens, pieces, tmp_path):
    layer = random_moe_layer(config, seed=tokens)
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, config.hidden_size)).astype(np.float32)
    logits = rng.standard_normal((tokens, config.num_experts)).astype(np.float32)
    feeds = {"x": x, "router_logits": logits}
    widened = {n: a.astype(np.float64) if "bias" in n else a for n, a in layer.items()}
    int8_model = moe_layer_model(config, layer, tmp_path, int8_activations=pieces)
    float_model = moe_layer_model(config, layer, tmp_path)
    emulated = {tiles: _emulated(config, widened, x, logits, pieces, tiles) for tiles in (False, True)}
    for name, library in libraries.items():
        expected = emulated[_integer_tiles(name)]
        magnitude = float(np.abs(expected).max())
        got = kernel_session(int8_model, library).run(None, feeds)[0]
        in_float = kernel_session(float_model, library).run(None, feeds)[0]
        worst, rms = float(np.abs(got - expected).max()), _rms(got - expected)
        assert worst <= EMULATION_LARGEST * magnitude, f"{name}: largest difference {worst:.2e} of {magnitude:.2e}"
        assert rms <= EMULATION_RMS * magnitude, f"{name}: root mean square difference {rms:.2e} of {magnitude:.2e}"
        # the int8 path ran: the float path is much further off; where the tiled experts run on AMX tiles (their
        # bf16 pieces as far from the float emulation as int8x2's rounding at this width), the other builds show it
        amx = name == "x86-64-v4-amx" or (name == "native" and runs_here(AMX))
        assert _rms(in_float - expected) > FLOAT_FURTHER * rms or config.hidden_size % 64 or amx, name


@pytest.mark.parametrize(("activations", "pieces", "bounds"), [("int8", 1, (LARGEST, RMS)), ("int8x2", 2, X2_BOUNDS)])
def test_the_engine_serves_int8_activations_within_the_bound_at_the_real_width(tmp_path, activations, pieces, bounds):
    checkpoint = make_checkpoint(tmp_path / "wide", REAL_WIDTH, "original")
    cache = tmp_path / "graphs"
    options = EngineOptions(
        checkpoint=str(checkpoint),
        max_positions=64,
        max_batch=1,
        cache_dir=str(cache),
        device="cpu",
        moe_activations=activations,
    )
    tokens = greedy_tokens(options, REAL_WIDTH_PROMPT, 4)
    model = compiled_model(Checkpoint(checkpoint), GraphOptions(64, moe_int8_pieces=pieces), cache)
    assert model.parent.name.endswith(f"-act8{'x2' if pieces == 2 else ''}")  # the backend's own graph, built above
    runtime = PagedRunner.create(str(model), REAL_WIDTH, 1, 64, kernels=kernel_library())
    reference = ReferenceModel(checkpoint)
    largest, root_mean_square = bounds
    worst, rms = drift_from_reference(runtime, reference, REAL_WIDTH_PROMPT, tokens, 2 * largest, False)
    assert worst < largest and rms < root_mean_square, f"largest {worst:.5f}, rms {rms:.5f}"


def test_the_older_spelling_of_int8_activations_still_reads():
    assert EngineOptions(moe_int8_activations=True, device="cpu").moe_activations == "int8"
    assert EngineOptions(moe_int8_activations=False).moe_activations == "float"
    with pytest.raises(ValidationError, match="give one of the two"):
        EngineOptions(moe_int8_activations=False, moe_activations="int8", device="cpu")
    with pytest.raises(ValidationError, match="give one of the two"):
        EngineOptions(moe_int8_activations=True, moe_activations="int8x2", device="cpu")


@pytest.mark.parametrize("activations", ["int8", "int8x2"])
@pytest.mark.parametrize("options", [{"device": "cuda"}, {"kernels": False}, {"moe": "qmoe"}])
def test_int8_activations_outside_the_cpu_kernel_are_a_configuration_error(options, activations):
    with pytest.raises(ValidationError, match="moe_activations int8 and int8x2 are options of the compiled CPU MoE"):
        EngineOptions(moe_activations=activations, **options)


@pytest.mark.parametrize(
    ("options", "device", "resolved"),
    [
        ({}, "cpu", "int8x2"),
        ({"kernels": False}, "cpu", "float"),
        ({}, "cuda", "float"),
        ({"moe": "qmoe"}, "cuda", "float"),
        ({"moe_activations": "float"}, "cpu", "float"),
        ({"moe_activations": "int8"}, "cpu", "int8"),
    ],
)
def test_auto_takes_two_int8_pieces_where_the_cpu_kernel_runs_and_float_elsewhere(options, device, resolved):
    """The default, `auto`: never refused, and int8x2 only where the compiled CPU MoE kernel decodes."""
    assert EngineOptions(**options).moe_activations == options.get("moe_activations", "auto")
    assert moe_activations(EngineOptions(**options), device) == resolved
