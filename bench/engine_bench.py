"""The built-in engine's speed on the CPU execution provider, on a small random-weight gpt-oss.

    python bench/engine_bench.py [--threads 0] [--quick] [--write docs/benchmarks.md]

Prefill and decode tokens/s at batch 1, 4 and 16 through the engine's runtime, then the same 16
requests through the batcher two ways in one run: all at once (continuous batching) and one at a time.
The model has the real vocabulary (201,088: the unembedding is most of a small model's bytes, as in
the real ones) and small widths; the checkpoint and its graph are generated into a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import markers, write_section  # noqa: E402

from backends.base import GenerateRequest, Sampling  # noqa: E402
from backends.engine.backend import EngineBackend, EngineOptions  # noqa: E402
from backends.engine.checkpoint import Checkpoint  # noqa: E402
from backends.engine.config import ModelConfig  # noqa: E402
from backends.engine.graph import GraphOptions  # noqa: E402
from backends.engine.kernels.build import kernel_library  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402
from backends.engine.model_cache import compiled_model  # noqa: E402
from backends.engine.paged_runner import PagedRunner  # noqa: E402
from harmony import load_harmony_encoding  # noqa: E402

NAME = "engine_bench"
CONFIG = ModelConfig(
    num_hidden_layers=4,
    num_experts=16,
    experts_per_token=4,
    hidden_size=256,
    intermediate_size=256,
    head_dim=32,
    num_attention_heads=8,
    num_key_value_heads=2,
)
BATCHES = (1, 4, 16)
MAX_POSITIONS = 1024


@dataclass
class Sizes:
    prompt: int
    decode_steps: int
    requests: int
    new_tokens: int


FULL = Sizes(prompt=128, decode_steps=32, requests=16, new_tokens=48)
QUICK = Sizes(prompt=32, decode_steps=4, requests=4, new_tokens=6)


def _prompt(rng: np.random.Generator, length: int) -> list[int]:
    return rng.integers(0, 199_000, size=length).tolist()


def runtime_rates(model: str, threads: int, sizes: Sizes) -> dict[int, tuple[float, float]]:
    """Batch → (prefill tok/s, decode tok/s) through the runtime; prompts are prefilled one sequence at a time."""
    runtime = PagedRunner.create(model, CONFIG, max(BATCHES), MAX_POSITIONS, threads=threads, kernels=kernel_library())
    rng = np.random.default_rng(0)
    runtime.prefill(0, _prompt(rng, sizes.prompt))  # warm-up
    runtime.decode([(0, 1, sizes.prompt)])
    rates = {}
    for batch in BATCHES:
        prompts = [_prompt(rng, sizes.prompt) for _ in range(batch)]
        started = time.perf_counter()
        for sequence, prompt in enumerate(prompts):
            runtime.prefill(sequence, prompt)
        prefill = batch * sizes.prompt / (time.perf_counter() - started)
        # each sequence its own random token a step: one token fed to all would route them to the same experts
        tokens = rng.integers(0, 199_000, size=(sizes.decode_steps, batch)).tolist()
        started = time.perf_counter()
        for step in range(sizes.decode_steps):
            runtime.decode([(sequence, tokens[step][sequence], sizes.prompt + step) for sequence in range(batch)])
        decode = batch * sizes.decode_steps / (time.perf_counter() - started)
        rates[batch] = (prefill, decode)
    return rates


async def generated_tokens(backend: EngineBackend, prompt: list[int], new_tokens: int) -> int:
    """Greedy tokens the engine gives `prompt`, up to `new_tokens`."""
    request = GenerateRequest(prompt, new_tokens, (), "bench", Sampling(temperature=0))
    count = 0
    async for chunk in backend.generate(request):
        count += len(chunk.tokens)
    return count


def batcher_throughput(checkpoint: Path, cache: Path, threads: int, sizes: Sizes) -> tuple[float, float]:
    """(tokens/s all at once, tokens/s one at a time) for the same requests through the engine backend."""
    options = EngineOptions(
        checkpoint=str(checkpoint),
        max_batch=sizes.requests,
        max_positions=MAX_POSITIONS,
        threads=threads,
        cache_dir=str(cache),
    )

    async def scenario() -> tuple[float, float]:
        backend = EngineBackend(options, load_harmony_encoding())
        rng = np.random.default_rng(1)
        prompts = [_prompt(rng, sizes.prompt) for _ in range(sizes.requests)]
        await generated_tokens(backend, prompts[0], 2)  # load and warm up
        started = time.perf_counter()
        together = sum(await asyncio.gather(*(generated_tokens(backend, p, sizes.new_tokens) for p in prompts)))
        batched = together / (time.perf_counter() - started)
        started = time.perf_counter()
        alone = 0
        for prompt in prompts:
            alone += await generated_tokens(backend, prompt, sizes.new_tokens)
        sequential = alone / (time.perf_counter() - started)
        await backend.aclose()
        assert together == alone == sizes.requests * sizes.new_tokens
        return batched, sequential

    return asyncio.run(scenario())


def report(rates: dict[int, tuple[float, float]], batched: float, sequential: float, threads: int, sizes: Sizes) -> str:
    start, end = markers(NAME)
    c = CONFIG
    lines = [
        start,
        "## Built-in engine, CPU execution provider (`bench/engine_bench.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"onnxruntime {onnxruntime.__version__}, intra-op threads {threads or 'one per core'}. fp32; MoE by "
        f"{'the compiled kernel' if kernel_library() else 'the pure-ONNX realization'} (as the engine runs it).",
        f"Model (random weights): {c.num_hidden_layers} layers, "
        f"{c.num_experts} MXFP4 experts top-{c.experts_per_token}, "
        f"hidden {c.hidden_size}, {c.num_attention_heads} heads / {c.num_key_value_heads} KV heads of {c.head_dim}, "
        f"vocabulary {c.vocab_size:,}. Prompts of {sizes.prompt} tokens.",
        "",
        "| batch | prefill tok/s | decode tok/s | decode speed-up vs batch 1 |",
        "|---|---|---|---|",
    ]
    for batch, (prefill, decode) in rates.items():
        lines.append(f"| {batch} | {prefill:,.0f} | {decode:,.0f} | {decode / rates[1][1]:.1f}x |")
    lines += [
        "",
        f"Prefill runs one prompt at a time here (the batcher runs a chunk of one prompt in each step, beside the "
        f"decode rows), so its rate does not grow with the batch; decode advances every running sequence in one step "
        f"({sizes.decode_steps} steps timed).",
        "",
        f"{sizes.requests} requests of {sizes.new_tokens} new tokens each (greedy) through the engine backend:",
        "",
        "| how | generated tok/s | ratio |",
        "|---|---|---|",
        f"| one at a time | {sequential:,.0f} | 1.0x |",
        f"| all at once (continuous batching) | {batched:,.0f} | {batched / sequential:.1f}x |",
        "",
        "CUDA figures (a 20b-shaped checkpoint against the memory-bandwidth bound) need a GPU machine; "
        "none was lent to the session that wrote this.",
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: one per core)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, figures mean nothing")
    parser.add_argument("--write", type=Path, help="markdown file whose engine section is replaced")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as scratch:
        directory = Path(scratch)
        checkpoint = write_random_checkpoint(directory / "model", CONFIG, "original", seed=0)
        model = compiled_model(Checkpoint(checkpoint), GraphOptions(MAX_POSITIONS), directory / "graphs")
        rates = runtime_rates(str(model), args.threads, sizes)
        batched, sequential = batcher_throughput(checkpoint, directory / "graphs", args.threads, sizes)
    section = report(rates, batched, sequential, args.threads, sizes)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
