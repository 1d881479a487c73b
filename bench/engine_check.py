"""The engine on a device, proven: parity against the CPU fp32 engine, the MXFP4 MoE kernel against the CPU
kernel, the sampler, then the full gpt-oss-20b or -120b shape (random weights) for speed and memory.

    python bench/engine_check.py --device cuda --out DIR [--model 20b|120b] [--docs docs/benchmarks.md]

Steps (each reported, a failure recorded and the next step run):
1. parity: small random checkpoints (real vocabulary and head size) converted for the CPU (float32) and for
   the device in bf16 and fp16: logits after a 150-token prompt (past the 128 window), greedy runs of 100
   tokens compared token by token, and the device's argmax agreement when fed the CPU's tokens, each
   disagreement weighed against the CPU's top-two margin there (a near tie or an error);
2. kernel: the device MXFP4MoE kernel against the CPU kernel on a 20b-shaped layer (1, 3, 64 and 256 tokens: the
   last on the GEMM path), the layer alone timed (1 to 1,024 tokens) against the expert bytes it reads, and on
   each path alone (to choose the threshold), and on CUDA ONNX Runtime's contrib
   QMoE (fp4) on the same layer in both weight layouts it may read (bench/qmoe_layer.py): its outputs against
   our kernel's, and its timing;
   attention (its own step: `--steps attention`, on a GPU): one PagedAttention node at gpt-oss's heads
   (bench/attention_layer.py): an 8k prompt's prefill (full and window layers) and a 2,048-token chunk at
   position 129k on the tensor cores against the CUDA-core tiles, and a decode step of 64 rows;
3. sampler: the SampleTokens kernel on the device beside the NumPy sampler (bench/sampler_bench.py), 1 to 256
   rows at the real vocabulary;
4. scale (`--model 20b`, or 120b in its own run): a random checkpoint of the model's shape (its experts zero,
   left as holes, so that 120b fits a 64 GB disk; the kernels' work does not depend on the values), converted
   to bf16, loaded on the device: decode tokens/s (20b: batch 1, 8, 32, 64; 120b: 1, 8; each step sampled as
   the engine serves: on the device with the kernels; 20b also 256 sequences at 2,048 positions each),
   time to first token (20b: 1k and 8k prompts; 120b: 1k), KV capacity, and batch-1 decode as a fraction of
   the HBM bound (bytes read per token / measured copy bandwidth);
   sweep (its own step: `--steps sweep`, on a GPU; bench/moe_sweep.py): every launch variant of the MoE kernel
   at every step size, the fastest per size written as the table the engine reads (DIR/moe_tuning.json and the
   package's backends/engine/kernels/moe_tuning.json); then the decode attention's keys per split part at every
   row count and context (bench/attention_sweep.py: DIR/attention_tuning.json and the package's); the scale step
   reports the variants it ran with;
5. host (`--steps host`, on any device; bench/host_costs_check.py): the host's cost per decode step as the engine
   serves (20b's width at 2 layers, 1 and 8 sequences): the step's time and the host's part of it, session runs,
   waits for the device's results and host input bytes per step;
6. paged (its own run: `--steps paged`): gpt-oss-20b's shape on the paged KV pools: 512 sequences at 2,048
   positions each decoded together (the full-attention pool holding their positions, the window pool only
   their windows), then a 131,000-token prompt prefilled in chunks of 2,048, each chunk in one step beside 64
   short sequences' decode rows (their tokens/s during it, and alone in the same run).
Results go to DIR/engine_check.json and DIR/engine_check.md (the docs section).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # loads CUDA and cuDNN into the process where torch carries them (the GPU machines' image)
    import torch
except ImportError:
    torch = None

import numpy as np
from attention_layer import attention_timing
from attention_sweep import attention_sweep
from engine_check_report import GEMM_ENV, MMA_ENV, PREFETCH_ENV, SECTION, markdown
from host_costs_check import host_costs
from kernel_session import kernel_session
from moe_sweep import layer_inputs, moe_sweep, run_layer, time_layer
from qmoe_layer import qmoe_layer_model
from report import write_section
from sampler_bench import measure

from backends.base import Sampling
from backends.engine.checkpoint import Checkpoint
from backends.engine.config import DEMO_CONFIG, GPT_OSS_20B, GPT_OSS_120B, ModelConfig
from backends.engine.graph import GraphOptions
from backends.engine.kernels import moe_tuning
from backends.engine.make_checkpoint import random_moe_layer, write_random_checkpoint
from backends.engine.model_cache import compiled_model
from backends.engine.op_models import moe_layer_model
from backends.engine.paged_runner import PagedRunner
from backends.engine.runtime import cuda_unavailable_reason
from backends.engine.sampler import RowSpec, sampling_rows

PARITY_CONFIG = replace(DEMO_CONFIG, hidden_size=256, intermediate_size=256, head_dim=64)  # real head size
PROMPT = [(7919 * i) % 200000 + 11 for i in range(150)]
GREEDY_TOKENS = 100
SCALE_DTYPE = "bfloat16"


@dataclass(frozen=True)
class Scale:
    """One model's speed check: its shape, KV slots and positions, decode batches and prompt lengths."""

    config: ModelConfig
    slots: int
    positions: int
    batches: tuple[int, ...]
    prompts: tuple[int, ...]
    compare: bool  # also CUDA graphs and QMoE, each in a runtime of its own (20b only: 120b loads 61 GB each)


SCALES = {
    "20b": Scale(GPT_OSS_20B, 64, 8192 + 256, (1, 8, 32, 64), (1024, 8192), True),
    "120b": Scale(GPT_OSS_120B, 8, 4096 + 256, (1, 8), (1024,), False),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


SAVE: Callable[[], None] = lambda: None  # noqa: E731 (set by main: writes the results so far)


def step(results: dict[str, Any], name: str, run: Callable[[], Any]) -> None:
    started = time.perf_counter()
    try:
        results[name] = run()
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
    results[name + "_seconds"] = round(time.perf_counter() - started, 1)
    SAVE()
    log(f"{name}: {json.dumps(results[name], default=str)[:2000]}")


def greedy(runtime: PagedRunner, steps: int, forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens after PROMPT (or, with `forced`, the argmax at each step while feeding `forced`)."""
    logits = runtime.prefill(0, PROMPT)
    tokens, every = [], [logits]
    for position in range(len(PROMPT), len(PROMPT) + steps):
        tokens.append(int(np.argmax(logits)))
        fed = forced[len(tokens) - 1] if forced else tokens[-1]
        logits = runtime.decode([(0, fed, position)])[0]
        every.append(logits)
    return tokens, every


def parity(work: Path, device: str, kernels: Path | None, cuda_graph: bool) -> dict[str, Any]:
    checkpoint = Checkpoint(write_random_checkpoint(work / "parity", PARITY_CONFIG, "original", seed=3))
    positions = 512
    cpu_model = compiled_model(checkpoint, GraphOptions(positions, "float32"), work / "graphs")
    cpu = PagedRunner.create(str(cpu_model), PARITY_CONFIG, 1, positions, kernels=kernels)
    reference_tokens, reference_logits = greedy(cpu, GREEDY_TOKENS)
    scale = float(np.abs(reference_logits[0]).max())
    report: dict[str, Any] = {"logit_scale": round(scale, 3)}
    realizations = ("mxfp4moe", "qmoe") if device == "cuda" else ("mxfp4moe",)  # QMoE fp4: CUDA kernels only
    for moe in realizations:
        for dtype in ("bfloat16", "float16"):
            key = dtype if moe == "mxfp4moe" else f"{moe}_{dtype}"
            try:
                report[key] = parity_of(
                    checkpoint, dtype, moe, device, kernels, cuda_graph, reference_tokens, reference_logits
                )
            except Exception as exc:
                report[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return report


def parity_of(
    checkpoint: Checkpoint,
    dtype: str,
    moe: str,
    device: str,
    kernels: Path | None,
    cuda_graph: bool,
    reference_tokens: list[int],
    reference_logits: list[np.ndarray],
) -> dict[str, Any]:
    positions = 512
    scale = float(np.abs(reference_logits[0]).max())
    work = checkpoint.directory.parent
    model = compiled_model(checkpoint, GraphOptions(positions, dtype, moe), work / "graphs")
    runtime = PagedRunner.create(
        str(model), PARITY_CONFIG, 1, positions, kernels=kernels, device=device, dtype=dtype, cuda_graph=cuda_graph
    )
    tokens, _ = greedy(runtime, GREEDY_TOKENS)
    same = next((i for i, (a, b) in enumerate(zip(tokens, reference_tokens, strict=True)) if a != b), len(tokens))
    forced_tokens, forced_logits = greedy(runtime, GREEDY_TOKENS, forced=reference_tokens)
    differences = [float(np.abs(a - b).max()) for a, b in zip(forced_logits, reference_logits, strict=True)]
    agree = sum(a == b for a, b in zip(forced_tokens, reference_tokens, strict=True))
    # A step's argmax can differ only where the CPU's top two logits are within twice the step's largest
    # logit difference of each other (each moved by at most that much): a near tie, not an error.
    margins = [top_margin(logits) for logits in reference_logits[:-1]]
    disagreements = [i for i, (a, b) in enumerate(zip(forced_tokens, reference_tokens, strict=True)) if a != b]
    decisive = [i for i in disagreements if margins[i] > 2 * differences[i]]
    return {
        "prompt_logits_max_abs_diff": round(differences[0], 5),
        "max_abs_diff_over_run": round(max(differences), 5),
        "relative_to_logit_scale": round(max(differences) / scale, 5),
        "greedy_tokens_equal_before_first_difference": same,
        "cpu_margin_at_first_difference": round(margins[same], 5) if same < len(margins) else None,
        "argmax_agreement_fed_cpu_tokens": f"{agree}/{len(forced_tokens)}",
        "cpu_margins_at_disagreements": [round(margins[i], 5) for i in disagreements],
        "disagreements_beyond_a_near_tie": len(decisive),
    }


def top_margin(logits: np.ndarray) -> float:
    """How far the largest logit stands above the second."""
    top_two = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(top_two[1] - top_two[0])


KERNEL_TOKENS = (1, 3, 64, 256)  # 256: a prefill's step, on the GEMM path in 16-bit activations


def kernel_vs_cpu(work: Path, device: str, kernels: Path) -> dict[str, Any]:
    config = GPT_OSS_20B
    layer = random_moe_layer(config, seed=1)
    report: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16"):
        model = moe_layer_model(config, layer, work / "moe", dtype)
        options = GraphOptions(16, dtype)
        sessions = {where: layer_session(model, kernels, where) for where in ("cpu", device)}
        for tokens in KERNEL_TOKENS:
            x, logits = layer_inputs(tokens, config, options)
            expected, got = (run_layer(sessions[where], x, logits, options) for where in ("cpu", device))
            report[f"{dtype}_tokens_{tokens}"] = {
                "max_abs_diff": float(np.abs(got - expected).max()),
                "output_scale": float(np.abs(expected).max()),
            }
        if dtype == "bfloat16":
            report["timing"] = kernel_timing(sessions[device], device, config, options)
            if device == "cuda":
                for name, gemm, mma, prefetch in (  # each path alone: CUDA cores, tensor-core tiles (without
                    # their L2 prefetch too), cuBLAS GEMMs
                    ("timing_cuda_cores", 0, 0, 1), ("timing_mma", 0, 1, 1), ("timing_mma_no_l2_prefetch", 0, 1, 0),
                    ("timing_gemms", 1, 0, 1),
                ):  # fmt: skip
                    session = layer_session(
                        model, kernels, device, gemm_min_tokens=gemm, mma_min_tokens=mma, l2_prefetch=prefetch
                    )
                    report[name] = kernel_timing(session, device, config, options)
                report["qmoe"] = qmoe_vs_kernel(work, config, layer, sessions[device], options)
    return report


def layer_session(
    model: Path,
    kernels: Path,
    device: str,
    gemm_min_tokens: int | None = None,
    mma_min_tokens: int | None = None,
    l2_prefetch: int | None = None,
):
    """A session of a one-layer model on the device with our kernels; with `gemm_min_tokens` (`mma_min_tokens`),
    its CUDA kernel takes the GEMM (tensor-core tile) path from that many tokens (0: never) instead of the
    default; `l2_prefetch` 0: the tiles without their L2 prefetch."""
    env = {GEMM_ENV: gemm_min_tokens, MMA_ENV: mma_min_tokens, PREFETCH_ENV: l2_prefetch}
    return kernel_session(model, kernels, device, env)


def qmoe_vs_kernel(work: Path, config: ModelConfig, layer: dict[str, np.ndarray], kernel, options: GraphOptions):
    """ONNX Runtime's contrib QMoE (fp4) on the same layer, its weights by column as the engine's qmoe graph has
    them: its outputs against our kernel's, and its timing (keyed by the layout, as earlier runs reported both)."""
    import onnxruntime as ort

    try:
        model = qmoe_layer_model(config, layer, work / "qmoe", "bfloat16")
        session = ort.InferenceSession(str(model), providers=["CUDAExecutionProvider"])
        rows: dict[str, Any] = {}
        for tokens in KERNEL_TOKENS:
            x, logits = layer_inputs(tokens, config, options)
            ours, theirs = run_layer(kernel, x, logits, options), run_layer(session, x, logits, options)
            rows[f"tokens_{tokens}"] = {
                "max_abs_diff": float(np.abs(theirs - ours).max()),
                "output_scale": float(np.abs(ours).max()),
            }
        rows["timing"] = kernel_timing(session, "cuda", config, options)
    except Exception as exc:
        rows = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    return {"columns": rows}


def kernel_timing(session, device: str, config: ModelConfig, options: GraphOptions) -> dict[str, Any]:
    """The layer alone on the device at 1 to 1,024 tokens (moe_sweep.time_layer)."""
    return {f"tokens_{tokens}": time_layer(session, device, config, options, tokens) for tokens in (1, 8, 64, 1024)}


def bytes_per_token(config: ModelConfig, dtype_bytes: int) -> dict[str, float]:
    """What one batch-1 decode step must read: non-expert weights, the k routed experts, one embedding row."""
    c = config
    attention = (
        c.qkv_rows * c.hidden_size
        + c.qkv_rows
        + c.hidden_size * c.num_attention_heads * c.head_dim
        + c.hidden_size
        + c.num_attention_heads
        + 2 * c.hidden_size
    )
    router = c.num_experts * c.hidden_size + c.num_experts
    expert_values = 2 * c.intermediate_size * c.hidden_size + c.hidden_size * c.intermediate_size
    expert = expert_values // 2 + expert_values // 32 + (2 * c.intermediate_size + c.hidden_size) * dtype_bytes
    per_layer = (attention + router) * dtype_bytes + c.experts_per_token * expert
    unembedding = c.vocab_size * c.hidden_size * dtype_bytes
    total = c.num_hidden_layers * per_layer + unembedding + c.hidden_size * dtype_bytes
    return {"weights_read_per_token_gb": total / 1e9, "unembedding_gb": unembedding / 1e9}


def copy_bandwidth() -> float | None:
    """Device-to-device copy, bytes read + written per second (torch, where present)."""
    if torch is None or not torch.cuda.is_available():
        return None
    source = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    torch.cuda.synchronize()
    started = time.perf_counter()
    repeats = 20
    for _ in range(repeats):
        target.copy_(source)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    del source, target
    torch.cuda.empty_cache()
    return 2 * 2 * 1024**3 * repeats / elapsed


def device_memory() -> tuple[int, int] | None:
    if torch is None or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def scale_key(model_name: str) -> str:
    return "scale" if model_name == "20b" else f"scale_{model_name}"


def decoder(runner: PagedRunner, batch: int, context: int = 128) -> Callable[[int], None]:
    """Decode step i of `batch` sequences as the engine serves it: the batch run and its tokens sampled (on the
    device when the kernels are loaded: only token ids come back), each next step fed the sampled tokens. The
    sequences stand at `context` positions: a 128-token prompt prefilled; past that, the KV as the buffers
    hold it (zeros: attention reads and weighs every position all the same), so that hundreds of long
    sequences need no prefill of their own."""
    runtime = runner.runtime
    if context == 128:
        for slot in range(batch):
            runner.fill(slot, PROMPT[:128])
    specs = [RowSpec(slot, Sampling(temperature=1.0), np.random.default_rng(slot)) for slot in range(batch)]
    tokens = [1000 + slot for slot in range(batch)]

    def advance(i: int) -> None:
        runner.step([(slot, tokens[slot], context + i) for slot in range(batch)])
        tokens[:] = runtime.sample(sampling_rows(specs, runtime.config.vocab_size)).tokens.tolist()

    return advance


def timed_decode(runner: PagedRunner, batch: int, steps: int, context: int = 128) -> float:
    """Decode tokens/s over `steps` steps (after two: warm-up and graph capture)."""
    advance = decoder(runner, batch, context)
    advance(0)
    advance(1)
    started = time.perf_counter()
    for i in range(steps):
        advance(2 + i)
    return batch * steps / (time.perf_counter() - started)


def kernel_profile(runner: PagedRunner, batch: int, steps: int = 8, context: int = 128) -> dict[str, Any]:
    """The device kernels of `steps` decode steps at `context` positions (torch's profiler: CUPTI sees every
    kernel in the process, ONNX Runtime's and ours): GPU µs per step in all and by kernel, the 25 largest."""
    advance = decoder(runner, batch, context)
    advance(0)
    advance(1)
    return profiled(lambda: [advance(2 + i) for i in range(steps)], steps)


def prefill_profile(runner: PagedRunner, length: int) -> dict[str, Any]:
    """The device kernels of one `length`-token prefill into sequence 0 (after a warm-up prefill of as many)."""
    prompt = [(31 * i) % 200000 + 5 for i in range(length)]
    runner.fill(0, prompt)
    return profiled(lambda: runner.fill(0, prompt), 1)


def profiled(work: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """GPU µs per repeat of `work` in all and by kernel (the 25 largest), from torch's profiler."""
    if torch is None or not torch.cuda.is_available():
        return {"error": "needs torch with CUDA (the GPU machines' image)"}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        work()
        torch.cuda.synchronize()
    kernels = []
    for event in profiler.key_averages():
        spent = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if spent > 0:
            kernels.append((spent, event.count, event.key))
    kernels.sort(reverse=True)
    return {
        "gpu_us_per_step": round(sum(k[0] for k in kernels) / repeats, 1),
        "kernels": [
            {"name": name[:160], "us_per_step": round(spent / repeats, 1), "launches_per_step": count / repeats}
            for spent, count, name in kernels[:25]
        ],
    }


MANY = 256  # the "256 sequences of 2k context"
MANY_CONTEXT = 2048


def many_sequences(directory: Path, work: Path, device: str, kernels: Path | None, cuda_graph: bool) -> dict[str, Any]:
    """Decode tokens/s in total with 256 sequences at 2,048 positions each (KV slots of 2,304 positions)."""
    report: dict[str, Any] = {}
    try:
        positions = MANY_CONTEXT + 256
        model = compiled_model(Checkpoint(directory), GraphOptions(positions, SCALE_DTYPE), work / "graphs")
        runtime = PagedRunner.create(
            str(model), GPT_OSS_20B, MANY, positions, kernels=kernels, device=device, dtype=SCALE_DTYPE,
            cuda_graph=cuda_graph,
        )  # fmt: skip
        report["many_kv_gb_allocated"] = round(runtime.runtime.kv_bytes / 1e9, 2)
        tok_s = timed_decode(runtime, MANY, 16, MANY_CONTEXT)
        report[f"decode_tok_s_{MANY}_sequences_{MANY_CONTEXT}_context"] = round(tok_s, 1)
        log(f"{MANY} sequences at {MANY_CONTEXT}: {tok_s:.1f} tok/s")
        if device == "cuda":  # where such a step's device time goes
            report[f"profile_batch_{MANY}_at_{MANY_CONTEXT}"] = kernel_profile(runtime, MANY, 4, MANY_CONTEXT)
    except Exception as exc:
        report["many_error"] = f"{type(exc).__name__}: {exc}"[:600]
    return report


def sampler_figures(device: str) -> dict[str, Any]:
    """bench/sampler_bench.py on this device: the SampleTokens kernel beside the NumPy sampler (with its copy)."""
    rows = measure(device, (1, 64, 256), 20)
    return {f"{kind}, batch {batch}": {"numpy_ms": round(a, 3), "kernel_ms": round(b, 3)} for batch, kind, a, b in rows}


def time_to_first_token(runner: PagedRunner, length: int) -> float:
    """Seconds for one prefill call of a `length`-token prompt into sequence 0 and its first token sampled (after a
    short warm-up prefill)."""
    prompt = [(31 * i) % 200000 + 5 for i in range(length)]
    runtime = runner.runtime
    first = sampling_rows([RowSpec(0, Sampling(temperature=0), np.random.default_rng(0))], runtime.config.vocab_size)
    runner.fill(0, prompt[:64])
    runtime.sample(first)
    started = time.perf_counter()
    runner.fill(0, prompt)
    runtime.sample(first)
    return time.perf_counter() - started


def scale(
    work: Path,
    device: str,
    kernels: Path | None,
    results: dict[str, Any],
    cuda_graph: bool,
    model_name: str,
    qmoe: bool = True,
) -> dict[str, Any]:
    setting = SCALES[model_name]
    config, positions, slots = setting.config, setting.positions, setting.slots
    report: dict[str, Any] = results.setdefault(scale_key(model_name), {})  # partial figures survive a timeout
    started = time.perf_counter()
    # the experts zero, as holes: a speed check reads and multiplies them all the same, and the checkpoint fits
    # a small disk (120b: about 4 GiB written instead of 61 GiB); parity is checked on random experts above
    directory = write_random_checkpoint(
        work / f"gpt-oss-{model_name}-zero-experts", config, "original", zero_experts=True
    )
    report["checkpoint_write_s"] = round(time.perf_counter() - started, 1)
    report["experts"] = "zero, read in place from the checkpoint's files"
    if device == "cuda" and kernels is not None:  # the MoE's launch variants, as the engine picks them at load
        report["moe_variants"] = moe_tuning.apply(config.num_experts, moe_tuning.cuda_gpu(0))
    started = time.perf_counter()
    model = compiled_model(Checkpoint(directory), GraphOptions(positions, SCALE_DTYPE), work / "graphs")
    report["convert_s"] = round(time.perf_counter() - started, 1)
    report["graph_data_gb"] = round(model.with_name(model.name + ".data").stat().st_size / 1e9, 2)
    before = device_memory()
    started = time.perf_counter()
    runtime = PagedRunner.create(
        str(model), config, slots, positions, kernels=kernels, device=device, dtype=SCALE_DTYPE, cuda_graph=cuda_graph
    )
    report["load_s"] = round(time.perf_counter() - started, 1)
    report["kv_gb_allocated"] = round(runtime.runtime.kv_bytes / 1e9, 2)
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    report["kv_bytes_per_token_per_sequence"] = kv_per_token
    for batch in setting.batches:
        report[f"decode_tok_s_batch_{batch}"] = round(timed_decode(runtime, batch, 48 if batch == 1 else 24), 1)
        log(f"batch {batch}: {report[f'decode_tok_s_batch_{batch}']} tok/s")
        SAVE()
    if device == "cuda":  # where a step's device time goes
        for batch in (1, setting.batches[-1]):
            try:
                report[f"profile_batch_{batch}"] = kernel_profile(runtime, batch)
            except Exception as exc:
                report[f"profile_batch_{batch}"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
            SAVE()
    for batch in (1, setting.batches[-1]):  # what a step's copy of the logits to the host would cost, against it
        copy_s = logits_copy_seconds(config, batch, device)
        report[f"logits_copy_us_batch_{batch}"] = round(copy_s * 1e6, 1)
        report[f"logits_copy_share_of_step_batch_{batch}"] = round(
            copy_s / (batch / report[f"decode_tok_s_batch_{batch}"]), 4
        )
    for length in setting.prompts:
        # the process's first prompt of its length (ONNX Runtime's arena grows for it), then the next one, as a
        # server that has served one sees it
        report[f"ttft_{length}_first_s"] = round(time_to_first_token(runtime, length), 3)
        report[f"ttft_{length}_s"] = round(time_to_first_token(runtime, length), 3)
        first, again = report[f"ttft_{length}_first_s"], report[f"ttft_{length}_s"]
        log(f"ttft {length}: {again} s (the first of its length: {first} s)")
    if device == "cuda":  # where the longest prompt's prefill spends its device time
        length = setting.prompts[-1]
        try:
            report[f"profile_prefill_{length}"] = prefill_profile(runtime, length)
        except Exception as exc:
            report[f"profile_prefill_{length}"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        SAVE()
    after = device_memory()
    kv_allocated = runtime.runtime.kv_bytes
    del runtime
    if before and after:
        used = before[0] - after[0]
        weights_and_workspace = used - kv_allocated
        report["device_memory_used_gb"] = round(used / 1e9, 2)
        report["weights_and_workspace_gb"] = round(weights_and_workspace / 1e9, 2)
        report["device_memory_total_gb"] = round(after[1] / 1e9, 2)
        report["kv_capacity_tokens_at_device_memory"] = int((after[1] - weights_and_workspace) * 0.95 // kv_per_token)
    need = bytes_per_token(config, 2)
    report.update({key: round(value, 3) for key, value in need.items()})
    bandwidth = results.get("copy_bandwidth_bytes_s")
    if bandwidth:
        bound = bandwidth / (need["weights_read_per_token_gb"] * 1e9)
        report["hbm_bound_tok_s"] = round(bound, 1)
        report["batch_1_fraction_of_bound"] = round(report["decode_tok_s_batch_1"] / bound, 3)
    SAVE()
    if not setting.compare:
        return report
    report.update(many_sequences(directory, work, device, kernels, cuda_graph))
    SAVE()
    report.update(graph_decode(model, config, kernels, device))
    if bandwidth and "cuda_graph_decode_tok_s_batch_1" in report:
        report["cuda_graph_batch_1_fraction_of_bound"] = round(report["cuda_graph_decode_tok_s_batch_1"] / bound, 3)
    SAVE()
    if device == "cuda" and qmoe:
        report.update(qmoe_decode(directory, work, device, positions, kernels))
        if bandwidth and "qmoe_decode_tok_s_batch_1" in report:
            report["qmoe_batch_1_fraction_of_bound"] = round(report["qmoe_decode_tok_s_batch_1"] / bound, 3)
    return report


PAGED_SEQUENCES = 512
PAGED_CONTEXT = 2048
LONG_PROMPT = 131_000
LONG_CHUNK = 2048
SHORT_SEQUENCES = 64


def paged(work: Path, device: str, kernels: Path | None) -> dict[str, Any]:
    """512 sequences of 2k context decoding, then a 131k-token prompt beside 64 decoding sequences (the issue's
    paged-KV figures), on a zero-expert 20b checkpoint."""
    config = GPT_OSS_20B
    report: dict[str, Any] = {}
    directory = work / "gpt-oss-20b-zero-experts"
    if not (directory / "config.json").is_file():
        write_random_checkpoint(directory, config, "original", zero_experts=True)
    positions = LONG_PROMPT + 256
    model = str(compiled_model(Checkpoint(directory), GraphOptions(positions, SCALE_DTYPE), work / "graphs"))
    page = GraphOptions(positions).page_size
    window_ring = -(-config.sliding_window // page) + 2
    try:
        full = PAGED_SEQUENCES * -(-(PAGED_CONTEXT + 64) // page) + 1
        runner = PagedRunner.create(
            model, config, PAGED_SEQUENCES, positions, full_pages=full,
            window_pages=PAGED_SEQUENCES * window_ring + 1, kernels=kernels, device=device, dtype=SCALE_DTYPE,
        )  # fmt: skip
        report["paged_kv_gb_allocated"] = round(runner.runtime.kv_bytes / 1e9, 2)
        tok_s = timed_decode(runner, PAGED_SEQUENCES, 8, PAGED_CONTEXT)
        report[f"decode_tok_s_{PAGED_SEQUENCES}_sequences_{PAGED_CONTEXT}_context"] = round(tok_s, 1)
        log(f"paged: {PAGED_SEQUENCES} sequences at {PAGED_CONTEXT}: {tok_s:.1f} tok/s")
        del runner
    except Exception as exc:
        report["paged_many_error"] = f"{type(exc).__name__}: {exc}"[:600]
    SAVE()
    try:
        report.update(long_beside_short(model, config, positions, page, window_ring, device, kernels))
    except Exception as exc:
        report["long_error"] = f"{type(exc).__name__}: {exc}"[:600]
    return report


def long_beside_short(
    model: str, config: ModelConfig, positions: int, page: int, ring: int, device: str, kernels: Path | None
) -> dict[str, Any]:
    report: dict[str, Any] = {}
    short_pages = -(-(128 + LONG_PROMPT // LONG_CHUNK * 2 + 64) // page)
    full = -(-positions // page) + SHORT_SEQUENCES * short_pages + 1
    window = SHORT_SEQUENCES * ring + -(-(config.sliding_window + LONG_CHUNK) // page) + 2
    runner = PagedRunner.create(
        model, config, SHORT_SEQUENCES + 1, positions, full_pages=full, window_pages=window,
        kernels=kernels, device=device, dtype=SCALE_DTYPE,
    )  # fmt: skip
    runtime = runner.runtime
    for sequence in range(SHORT_SEQUENCES):
        runner.fill(sequence, PROMPT[:128])
    specs = [RowSpec(row, Sampling(temperature=1.0), np.random.default_rng(row)) for row in range(SHORT_SEQUENCES)]
    tokens, position = [1000 + row for row in range(SHORT_SEQUENCES)], 128

    def decode_rows() -> list[tuple[int, list[int], int]]:
        return [(sequence, [tokens[sequence]], position) for sequence in range(SHORT_SEQUENCES)]

    def sample() -> None:
        tokens[:] = runtime.sample(sampling_rows(specs, config.vocab_size)).tokens[:SHORT_SEQUENCES].tolist()

    started = time.perf_counter()
    for _ in range(8):
        runner.run(decode_rows())
        sample()
        position += 1
    report["short_decode_tok_s_alone"] = round(SHORT_SEQUENCES * 8 / (time.perf_counter() - started), 1)
    long = [(31 * i) % 200000 + 5 for i in range(LONG_PROMPT)]
    started = time.perf_counter()
    steps = 0
    for start in range(0, LONG_PROMPT, LONG_CHUNK):
        runner.run([*decode_rows(), (SHORT_SEQUENCES, long[start : start + LONG_CHUNK], start)])
        sample()
        position += 1
        steps += 1
        if steps % 8 == 0:  # the rate so far, in the log, should the step be cut off
            log(f"paged: {start + LONG_CHUNK} of the long prompt's tokens in {time.perf_counter() - started:.1f} s")
    elapsed = time.perf_counter() - started
    report["long_prompt_tokens"] = LONG_PROMPT
    report["long_prefill_s_beside_64_decoding"] = round(elapsed, 1)
    report["short_decode_tok_s_during_long_prefill"] = round(SHORT_SEQUENCES * steps / elapsed, 1)
    report["long_kv_pages_full"] = len(runner.tables[SHORT_SEQUENCES].full)
    log(f"paged: {LONG_PROMPT} tokens beside {SHORT_SEQUENCES} decoding: {report}")
    return report


def logits_copy_seconds(config: ModelConfig, rows: int, device: str) -> float:
    """One copy of `rows` float32 logits rows from the device to the host, as the runtime makes each step."""
    import onnxruntime as ort

    value = ort.OrtValue.ortvalue_from_shape_and_type([rows, config.vocab_size], np.float32, device, 0)
    value.numpy()
    repeats = 20
    started = time.perf_counter()
    for _ in range(repeats):
        value.numpy()
    return (time.perf_counter() - started) / repeats


def qmoe_decode(directory: Path, work: Path, device: str, positions: int, kernels: Path | None) -> dict[str, Any]:
    """The same checkpoint with each MoE as ONNX Runtime's QMoE (the engine's `moe` qmoe): decode tokens/s
    and the 1k prompt's time to first token, to set against our kernel's (the same sampler: `kernels` is only
    that)."""
    report: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        model = compiled_model(Checkpoint(directory), GraphOptions(positions, SCALE_DTYPE, "qmoe"), work / "graphs")
        report["qmoe_convert_s"] = round(time.perf_counter() - started, 1)
        runtime = PagedRunner.create(
            str(model), GPT_OSS_20B, 64, positions, kernels=kernels, device=device, dtype=SCALE_DTYPE
        )
        for batch in (1, 8, 64):
            report[f"qmoe_decode_tok_s_batch_{batch}"] = round(timed_decode(runtime, batch, 24), 1)
            log(f"qmoe batch {batch}: {report[f'qmoe_decode_tok_s_batch_{batch}']} tok/s")
        report["qmoe_ttft_1024_s"] = round(time_to_first_token(runtime, 1024), 3)
    except Exception as exc:
        report["qmoe_error"] = f"{type(exc).__name__}: {exc}"[:600]
    return report


def graph_decode(model: Path, config: ModelConfig, kernels: Path | None, device: str) -> dict[str, Any]:
    """Decode with each batch size captured as a CUDA graph: speed, and the logits against plain runs."""
    report: dict[str, Any] = {}
    try:
        plain = PagedRunner.create(str(model), config, 8, 8192 + 256, kernels=kernels, device=device, dtype=SCALE_DTYPE)
        plain_tokens, plain_logits = greedy(plain, 8)
        del plain
        graphs = PagedRunner.create(
            str(model), config, 8, 8192 + 256, kernels=kernels, device=device, dtype=SCALE_DTYPE, cuda_graph=True
        )
        graph_logits = greedy(graphs, 8, forced=plain_tokens)[1]  # a near tie flipping a token changes no later step
        report["cuda_graph_fed_plain_tokens"] = True
        report["cuda_graph_max_abs_logit_diff"] = max(
            float(np.abs(a - b).max()) for a, b in zip(plain_logits, graph_logits, strict=True)
        )
        for batch in (1, 8):
            report[f"cuda_graph_decode_tok_s_batch_{batch}"] = round(timed_decode(graphs, batch, 48), 1)
            log(f"cuda graph batch {batch}: {report[f'cuda_graph_decode_tok_s_batch_{batch}']} tok/s")
    except Exception as exc:
        report["cuda_graph_error"] = f"{type(exc).__name__}: {exc}"
    return report


def merged(paths: list[str]) -> dict[str, Any]:
    """Results of several runs, later files filling what earlier ones lack (and replacing their steps); each
    file's `run` (its commit and device) listed under `runs`."""
    results: dict[str, Any] = {"runs": []}
    for path in paths:
        for key, value in json.loads(Path(path).read_text()).items():
            if key == "run":
                results["runs"].append(value)
                continue
            later_wins = key in (
                "parity",
                "sweep",
                "kernel",
                "attention",
                "sampler",
                "scale",
                "scale_120b",
                "paged",
                "host",
            )
            if value is not None and (key not in results or later_wins):
                results[key] = value
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", default=".")
    parser.add_argument("--work", default=None, help="scratch directory (checkpoints and graphs; ~30 GB)")
    parser.add_argument("--steps", default="parity,kernel,sampler,scale")
    parser.add_argument("--cuda-graph", action="store_true")
    parser.add_argument("--no-qmoe-decode", action="store_true", help="scale: skip the model on QMoE (a conversion)")
    parser.add_argument("--model", default="20b", choices=tuple(SCALES), help="the shape the scale step checks")
    parser.add_argument("--docs", help="also write the section into this markdown file (docs/benchmarks.md)")
    parser.add_argument("--render", nargs="+", help="only render saved engine_check.json files into --docs")
    args = parser.parse_args()
    if args.render:
        write_section(Path(args.docs), SECTION, markdown(merged(args.render)))
        return 0
    import onnxruntime as ort

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="engine-check-"))
    library = os.environ.get("GATEWAY_ENGINE_KERNELS")
    kernels = Path(library) if library else None
    results: dict[str, Any] = {"onnxruntime": ort.__version__, "cuda_graph": args.cuda_graph, "kernels": str(kernels)}
    if torch is not None and torch.cuda.is_available():
        results["device_name"] = torch.cuda.get_device_name(0)
    if args.device == "cuda":
        results["cuda_unavailable_reason"] = cuda_unavailable_reason(0)
        results["copy_bandwidth_bytes_s"] = copy_bandwidth()
    global SAVE

    def save() -> None:
        (out / "engine_check.json").write_text(json.dumps(results, indent=1, default=str))

    SAVE = save
    steps = args.steps.split(",")
    if "parity" in steps:
        step(results, "parity", lambda: parity(work, args.device, kernels, args.cuda_graph))
    if "sweep" in steps and kernels is not None:
        step(results, "sweep", lambda: moe_sweep(work, kernels, args.device, out, log))
        step(results, "attention_sweep", lambda: attention_sweep(work / "attention", kernels, args.device, out, log))
    if "kernel" in steps and kernels is not None:
        step(results, "kernel", lambda: kernel_vs_cpu(work, args.device, kernels))
    if "attention" in steps and kernels is not None:
        step(results, "attention", lambda: attention_timing(GPT_OSS_20B, work / "attention", kernels, args.device))
    if "sampler" in steps and kernels is not None:
        step(results, "sampler", lambda: sampler_figures(args.device))
    if "graph_parity" in steps:
        step(results, "graph_parity", lambda: parity(work, args.device, kernels, True))
    if "scale" in steps:
        run = lambda: scale(  # noqa: E731
            work, args.device, kernels, results, args.cuda_graph, args.model, not args.no_qmoe_decode
        )
        step(results, scale_key(args.model), run)
    if "paged" in steps:
        step(results, "paged", lambda: paged(work, args.device, kernels))
    if "host" in steps:
        step(results, "host", lambda: host_costs(work, args.device))
    (out / "engine_check.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "engine_check.md").write_text(markdown(results))
    if args.docs:
        write_section(Path(args.docs), SECTION, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
