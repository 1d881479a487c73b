"""Decode on the CPU with the dense weights read in bf16 (DenseBF16) against the same graph with float32 copies
of them (MatMul), in one run, alternated: gpt-oss-20b's width (hidden 2880, 32 experts top-4, vocabulary
201,088) at 6 layers (the issue's comparison shape) and optionally 24, random weights. Reported per shape:
decode tok/s at batch 1 and 4 and a 512-token prefill for both, their ratios, the bytes a decode step reads
(dense weights, the routed experts' MXFP4 bytes, the KV so far) and those bytes per second against the
machine's copy bandwidth measured in the same run (one large NumPy copy per thread, summed).

    python bench/dense_bf16_bench.py [--layers 6 24] [--threads 2] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import markers, write_section  # noqa: E402

from backends.engine.checkpoint import Checkpoint  # noqa: E402
from backends.engine.config import GPT_OSS_20B, ModelConfig  # noqa: E402
from backends.engine.graph import GraphOptions  # noqa: E402
from backends.engine.kernels.build import kernel_library  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402
from backends.engine.model_cache import compiled_model  # noqa: E402
from backends.engine.paged_runner import PagedRunner  # noqa: E402

NAME = "dense_bf16_bench"
PROMPT = 64
PREFILL = 512
STEPS = 8
ROUNDS = 3
MAX_POSITIONS = 1024


def copy_bandwidth(threads: int, mib: int = 512) -> float:
    """Bytes per second that `threads` threads move with NumPy copies (each reads and writes `mib` MiB)."""
    sources = [np.ones(mib << 18, np.float32) for _ in range(threads)]
    targets = [np.empty_like(source) for source in sources]
    for source, target in zip(sources, targets, strict=True):
        np.copyto(target, source)  # touch the pages
    best = 0.0
    for _ in range(3):
        workers = [threading.Thread(target=np.copyto, args=pair) for pair in zip(targets, sources, strict=True)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, 2 * threads * (mib << 20) / (time.perf_counter() - started))
    return best


def step_bytes(config: ModelConfig, dense_bytes: float, batch: int, position: int) -> float:
    """Bytes one decode step reads: dense weights once, the experts the batch routes to (at most all), the KV."""
    c = config
    expert = (2 * c.intermediate_size * c.hidden_size + c.hidden_size * c.intermediate_size) * 17 / 32  # MXFP4
    experts = min(c.num_experts, c.experts_per_token * batch) * expert * c.num_hidden_layers
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim * c.hidden_size
    out = c.num_attention_heads * c.head_dim * c.hidden_size
    dense = c.num_hidden_layers * (qkv + out + c.num_experts * c.hidden_size) + c.vocab_size * c.hidden_size
    kv = batch * c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * position * 4
    return dense * dense_bytes + experts + kv


def rates(runtime: PagedRunner, batch: int, rng: np.random.Generator, steps: int = STEPS) -> float:
    """Decode tokens a second over `steps` steps of `batch` sequences, each after a PROMPT-token prefill. Each
    sequence is fed its own random token each step, as llama.cpp's batched bench feeds its sequences: one token fed
    to every sequence routes them to the same experts, and the step reads fewer of them."""
    for slot in range(batch):
        runtime.prefill(slot, rng.integers(0, 199_000, size=PROMPT).tolist())
    tokens = rng.integers(0, 199_000, size=(steps, batch)).tolist()
    started = time.perf_counter()
    for step in range(steps):
        runtime.decode([(slot, tokens[step][slot], PROMPT + step) for slot in range(batch)])
    return batch * steps / (time.perf_counter() - started)


def prefill_rate(runtime: PagedRunner, rng: np.random.Generator) -> float:
    started = time.perf_counter()
    runtime.prefill(0, rng.integers(0, 199_000, size=PREFILL).tolist())
    return PREFILL / (time.perf_counter() - started)


def measure(layers: int, threads: int, work: Path) -> dict:
    config = dataclasses.replace(GPT_OSS_20B, num_hidden_layers=layers)
    checkpoint = Checkpoint(write_random_checkpoint(work / f"ckpt{layers}", config))
    kernels = kernel_library()
    runtimes = {}
    for dense in (True, False):
        model = compiled_model(checkpoint, GraphOptions(MAX_POSITIONS, dense_bf16=dense), work / "graphs")
        runtimes["bf16" if dense else "float32"] = PagedRunner.create(
            str(model), config, 4, MAX_POSITIONS, threads=threads, kernels=kernels
        )
    rng = np.random.default_rng(0)
    figures: dict = {"layers": layers}
    for runtime in runtimes.values():  # warm-up
        rates(runtime, 1, rng)
    samples: dict[str, list[float]] = {}
    for _ in range(ROUNDS):  # alternated, the best of each
        for name, runtime in runtimes.items():
            for batch in (1, 4):
                samples.setdefault(f"{name}_b{batch}", []).append(rates(runtime, batch, rng))
            samples.setdefault(f"{name}_prefill", []).append(prefill_rate(runtime, rng))
    figures.update({key: max(values) for key, values in samples.items()})
    for name, size in (("bf16", 2), ("float32", 4)):
        for batch in (1, 4):
            figures[f"{name}_b{batch}_bytes"] = step_bytes(config, size, batch, PROMPT + STEPS // 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[6])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        shapes = [measure(layers, args.threads, Path(scratch)) for layers in args.layers]
    bandwidth = copy_bandwidth(args.threads)
    print(shapes, bandwidth)
    section = report(shapes, bandwidth, args.threads)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


def report(shapes: list[dict], bandwidth: float, threads: int) -> str:
    start, end = markers(NAME)
    lines = [
        start,
        "## Dense weights read in bf16 on the CPU (`bench/dense_bf16_bench.py`)",
        "",
        f"{os.cpu_count()} CPUs ({platform.machine()}), {threads} threads, gpt-oss-20b's width with random weights,"
        " float32 activations: the same checkpoint's graph with its bf16 dense weights read as they are by",
        "DenseBF16, and with float32 copies for MatMul, alternated in one run (best of"
        f" {ROUNDS}; decode at position {PROMPT}, prefill of {PREFILL} tokens). Bytes per step: dense weights,",
        f"the routed experts' MXFP4 bytes and the KV; copy bandwidth {bandwidth / 1e9:.1f} GB/s ({threads} threads'"
        " NumPy copies, read + write).",
        "",
        "| layers | measure | float32 dense | bf16 dense | ratio | bf16 bytes/s ÷ copy bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for f in shapes:
        for batch in (1, 4):
            new, old = f[f"bf16_b{batch}"], f[f"float32_b{batch}"]
            share = new / batch * f[f"bf16_b{batch}_bytes"] / bandwidth
            lines.append(
                f"| {f['layers']} | decode, {batch} sequence{'s' if batch > 1 else ''} | {old:.2f} tok/s"
                f" | {new:.2f} tok/s | **{new / old:.2f}x** | {share:.2f} |"
            )
        new, old = f["bf16_prefill"], f["float32_prefill"]
        lines.append(
            f"| {f['layers']} | prefill, {PREFILL} tokens | {old:.0f} tok/s | {new:.0f} tok/s | {new / old:.2f}x | |"
        )
    lines.append(end)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
