"""KV memory following the tokens in use: the engine's paged pools against fixed slots of `max_positions`.

    python bench/kv_pages_bench.py [--write docs/benchmarks.md]

The engine's own batcher, page pools and prefix cache admit and run the requests; the decoder is a counting
stand-in (each step's rows advance, each sampled token is 1, each answer ends after its tokens), because what
is measured is which sequences the pools admit and which pages they hold, not the model's arithmetic (the
tests check that). Bytes are gpt-oss-20b's in bf16: a page of 32 positions holds 12 layers' keys and values
of 8 heads of 64 in each pool. Two loads in one run:

1. 256 requests with prompts of 10 to 4,000 tokens (log-uniform, seeded) and 64 new tokens each, all at
   once, into a full-attention pool of 32 x 4,160 positions: what 32 slots of `max_positions` 4,160 take.
   Slots would run 32 at a time whatever the lengths; the pages run as many as fit.
2. One conversation of 32,768 prompt tokens: the pages it holds once decoding, against one slot's 24 layers
   of 32,768 positions.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import markers, write_section  # noqa: E402

from backends.base import Chunk, GenerateRequest, Sampling  # noqa: E402
from backends.engine.backend import EngineOptions  # noqa: E402
from backends.engine.batcher import Batcher, Sequence  # noqa: E402
from backends.engine.config import GPT_OSS_20B  # noqa: E402
from backends.engine.page_pool import KvPools  # noqa: E402
from backends.engine.runtime import StepRows  # noqa: E402
from backends.engine.sampler import Sampled, SamplingRows  # noqa: E402

NAME = "kv_pages_bench"
PAGE = 32  # the engine's default
PAGE_SIZES = (16, 32, 64)
CHUNK = 512
CONFIG = GPT_OSS_20B
BF16 = 2
LAYER_POSITION_BYTES = 2 * CONFIG.num_key_value_heads * CONFIG.head_dim * BF16  # K and V of one position, one layer
FULL_LAYERS = sum(1 for layer in range(CONFIG.num_hidden_layers) if not CONFIG.is_sliding(layer))
WINDOW_LAYERS = CONFIG.num_hidden_layers - FULL_LAYERS


@dataclass
class CountingRuntime:
    """The decoder's interface to the batcher, computing nothing: it counts rows and answers token 1."""

    max_positions: int
    probe: Callable[[StepRows], None]  # called at each step, on the engine thread
    buckets: bool = False
    cuda_graph: bool = False
    config = CONFIG  # not a field: the sampler reads its vocabulary

    def run(self, step: StepRows) -> None:
        self.probe(step)

    def sample(self, rows: SamplingRows) -> Sampled:
        count = len(rows.rows)
        return Sampled(np.ones(count, np.int64), np.zeros(count, np.float32), None, None)

    def copy_page(self, kind: str, source: int, target: int, positions: int) -> None:
        pass

    def chunk_limit(self, context: int) -> int | None:
        return None


def run_load(prompts: list[list[int]], new_tokens: int, pool_tokens: int, max_positions: int, page: int) -> dict:
    """Every prompt through the batcher at once, in pools the engine sizes for `pool_tokens` and pages of `page`:
    peak running sequences, pages and positions, preemptions."""
    options = EngineOptions(
        max_batch=len(prompts), max_positions=max_positions, kv_cache_tokens=pool_tokens, page_size=page
    )
    full_pages, window_pages = options.full_pages(), options.window_pages(CONFIG.sliding_window)
    pools = KvPools(full_pages, window_pages, page, CONFIG.sliding_window)
    peak = {"running": 0, "full_pages": 0, "window_pages": 0, "tokens_at_peak_pages": 0}

    def probe(step: StepRows) -> None:
        """The pools as this step runs (its pages allocated)."""
        running = batcher.active
        full, window = pools.full.stats().in_use, pools.window.stats().in_use
        peak["running"] = max(peak["running"], running)
        peak["window_pages"] = max(peak["window_pages"], window)
        if full > peak["full_pages"]:
            written = sum(len(sequence.written.tokens) for sequence in batcher._running)
            in_flight = sum(len(tokens) for tokens in step.tokens)
            peak["full_pages"], peak["tokens_at_peak_pages"] = full, written + in_flight

    runtime = CountingRuntime(max(len(p) for p in prompts) + new_tokens + 1, probe)
    batcher = Batcher(runtime, pools, len(prompts), CHUNK, prefix_budget=0)  # type: ignore[arg-type]
    done = threading.Semaphore(0)

    def emit(item: Chunk | BaseException | None) -> None:
        if not isinstance(item, Chunk):
            assert item is None, item
            done.release()

    for index, prompt in enumerate(prompts):
        request = GenerateRequest(prompt, new_tokens, (), f"r{index}", Sampling(temperature=0))
        batcher.submit(Sequence(request, emit, np.random.default_rng(index)))
    for _ in prompts:
        assert done.acquire(timeout=600), "the load did not finish"
    time.sleep(0.05)  # the engine thread's counters after the last step
    preemptions = batcher.stats().preemptions
    batcher.close()
    return {**peak, "preemptions": preemptions, "full_pool": full_pages - 1, "window_pool": window_pages - 1}


def conversation(length: int) -> dict:
    """One prompt of `length` tokens, decoding: the pages it holds per pool."""
    pools = KvPools(length // PAGE + 4, 64, PAGE, CONFIG.sliding_window)
    runtime = CountingRuntime(length + 64, lambda step: None)
    batcher = Batcher(runtime, pools, 1, CHUNK, prefix_budget=0)  # type: ignore[arg-type]
    holding = threading.Event()
    release = threading.Event()
    seen: dict = {}

    def emit(item: Chunk | BaseException | None) -> None:
        if isinstance(item, Chunk) and not holding.is_set():  # on the engine thread, after the last chunk's step
            seen.update(full=pools.full.stats().in_use, window=pools.window.stats().in_use)
            holding.set()
        elif not isinstance(item, Chunk):
            release.set()

    request = GenerateRequest([5] * length, 8, (), "long", Sampling(temperature=0))
    batcher.submit(Sequence(request, emit, np.random.default_rng(0)))
    assert release.wait(600)
    batcher.close()
    return seen


def _per_position(run: dict, page: int) -> float:
    held = run["full_pages"] * page_bytes(FULL_LAYERS, page) + run["window_pages"] * page_bytes(WINDOW_LAYERS, page)
    return held / max(1, run["tokens_at_peak_pages"])


def page_bytes(layers: int, page: int = PAGE) -> int:
    return layers * page * LAYER_POSITION_BYTES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path)
    parser.add_argument("--quick", action="store_true", help="64 requests of up to 1,000 tokens: checks the script")
    args = parser.parse_args()
    requests, longest, slots, max_positions = (64, 1000, 8, 1064) if args.quick else (256, 4000, 32, 4160)
    rng = np.random.default_rng(7)
    lengths = np.exp(rng.uniform(math.log(10), math.log(longest), requests)).astype(int)
    prompts = [[7] * int(length) for length in lengths]
    loads = {page: run_load(prompts, 64, slots * max_positions, max_positions, page) for page in PAGE_SIZES}
    long = conversation(8192 if args.quick else 32768)
    section = report(loads, long, lengths, requests, slots, max_positions, 8192 if args.quick else 32768)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


def report(
    loads: dict[int, dict], long: dict, lengths: np.ndarray, requests: int, slots: int, positions: int, length: int
) -> str:
    start, end = markers(NAME)
    load = loads[PAGE]
    slot_bytes = CONFIG.num_hidden_layers * positions * LAYER_POSITION_BYTES
    pool_bytes = slots * slot_bytes
    allocated = load["full_pool"] * page_bytes(FULL_LAYERS) + load["window_pool"] * page_bytes(WINDOW_LAYERS)
    used = load["full_pages"] * page_bytes(FULL_LAYERS) + load["window_pages"] * page_bytes(WINDOW_LAYERS)
    tokens = load["tokens_at_peak_pages"]  # written before the step, and the step's
    long_bytes = long["full"] * page_bytes(FULL_LAYERS) + long["window"] * page_bytes(WINDOW_LAYERS)
    long_slot = CONFIG.num_hidden_layers * length * LAYER_POSITION_BYTES
    lines = [
        start,
        "## Paged KV: memory follows the tokens in use (`bench/kv_pages_bench.py`)",
        "",
        f"The engine's batcher, page pools ({PAGE}-position pages) and prefill chunks of {CHUNK}, with a counting"
        " stand-in for the decoder (the tests check the arithmetic); bytes are gpt-oss-20b's KV in bf16"
        f" ({LAYER_POSITION_BYTES * CONFIG.num_hidden_layers // 1024} KiB a position over 24 layers).",
        "",
        f"**{requests} requests at once**, prompts of {lengths.min()} to {lengths.max()} tokens (median"
        f" {int(np.median(lengths))}, {int(lengths.sum()):,} in all), 64 new tokens each, into a full-attention pool"
        f" of {slots} x {positions:,} positions ({pool_bytes / 2**30:.1f} GiB as {slots} slots of 24 layers):",
        "",
        "| | fixed slots | paged pools |",
        "|---|---|---|",
        f"| sequences running at once, at most | {slots} | {load['running']} |",
        f"| KV allocated | {pool_bytes / 2**30:.2f} GiB | {allocated / 2**30:.2f} GiB ({load['full_pool']:,}"
        f" full-layer pages, {load['window_pool']:,} window-layer pages, as the engine sizes them) |",
        f"| KV held at the peak | {pool_bytes / 2**30:.2f} GiB | {used / 2**30:.2f} GiB ({load['full_pages']:,}"
        f" full-layer pages, {load['window_pages']:,} window-layer pages) |",
        f"| bytes per position written, at the peak | {slot_bytes / positions / 1024:.0f} KiB x {positions:,}"
        f" per slot | {used / max(1, tokens) / 1024:.1f} KiB ({tokens:,} positions) |",
        f"| preemptions | - | {load['preemptions']} |",
        "",
        f"**One conversation of {length:,} tokens**, decoding: {long['full']} full-layer pages and {long['window']}"
        f" window-layer pages, {long_bytes / 2**20:,.0f} MiB against one slot's {long_slot / 2**20:,.0f} MiB"
        f" (**{long_bytes / long_slot:.3f}x**; the full layers' positions alone are"
        f" {FULL_LAYERS * length * LAYER_POSITION_BYTES / 2**20:,.0f} MiB).",
        "",
        "The same load by page size (the pool's positions fixed): smaller pages round less per sequence, larger"
        " ones hold a longer window ring and cut the page tables.",
        "",
        "| page size | sequences at once, at most | KV held at the peak per position written | preemptions |",
        "|---|---|---|---|",
        *(
            f"| {page} | {run['running']} | {_per_position(run, page) / 1024:.1f} KiB | {run['preemptions']} |"
            for page, run in loads.items()
        ),
        end,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
