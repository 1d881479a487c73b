"""The built-in engine at the full gpt-oss-20b or -120b shape on the CPU: generate, convert, load, serve.

    python bench/real_scale_bench.py [--shape gpt-oss-120b] [--dtype float32] [--workdir DIR]
                                     [--write docs/benchmarks.md]

A random-weight checkpoint with the real shape (20b: 24 layers, 32 experts; 120b: 36 layers, 128 experts;
hidden 2880, vocabulary 201,088; MXFP4 experts, bf16 elsewhere, the Hugging Face layout; 120b's experts zero,
left as holes in sparse files, so that it fits a small disk) is written, converted with `gpt-oss-gateway
convert`, then loaded and decoded through the public engine backend. Each phase runs in its own process,
so its peak RSS is its own (os.wait4). Recorded: time and peak RSS of each phase, the checkpoint's and
the graph's size on disk, load time, time to first token for a 128-token prompt, and decode tokens/s at
batch 1 and 4. The output is noise (random weights); the sizes and speeds are the real model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from report import markers, write_section  # noqa: E402

PROMPT_TOKENS = 128
NEW_TOKENS = 12
MAX_POSITIONS = 4096


def _anonymous_gib(pid: int) -> float:
    """The process's resident anonymous memory (RssAnon: not file pages), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return 0.0


def _run(args: list[str]) -> tuple[float, float, float, str]:
    """(seconds, peak RSS in GiB, peak anonymous RSS in GiB sampled every 0.1 s, stdout) of a child process,
    which must succeed."""
    started = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    peak_anonymous = [0.0]

    def sample() -> None:
        while child.poll() is None:
            peak_anonymous[0] = max(peak_anonymous[0], _anonymous_gib(child.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed with status {child.returncode}")
    return time.perf_counter() - started, usage.ru_maxrss / 1024**2, peak_anonymous[0], out


def _size_gib(path: Path, blocks: bool = False, written: bool = False) -> float:
    """Bytes of the files under `path` in GiB: their sizes, or the disk blocks they take; `written`: not the
    hard links to the checkpoint's shards a graph reads its experts through."""
    files = [f for f in path.rglob("*") if f.is_file() and not (written and f.name.startswith("linked-"))]
    return sum(f.stat().st_blocks * 512 if blocks else f.stat().st_size for f in files) / 1024**3


async def _serve(checkpoint: str, cache: str, dtype: str) -> dict[str, float]:
    """In the serving process: load through the public backend, then time generation."""
    from backends.base import GenerateRequest, Sampling
    from backends.engine.backend import EngineBackend, EngineOptions
    from harmony import load_harmony_encoding

    options = EngineOptions(
        checkpoint=checkpoint, cache_dir=cache, dtype=dtype, max_batch=4, max_positions=MAX_POSITIONS
    )
    started = time.perf_counter()
    backend = EngineBackend(options, load_harmony_encoding())
    while not await backend.ready():
        await asyncio.sleep(0.1)
    load_s = time.perf_counter() - started
    rng = np.random.default_rng(0)

    async def generate(prompt: list[int]) -> tuple[float, float, int]:
        """(time to first token, time of the rest, tokens after the first)."""
        request = GenerateRequest(prompt, NEW_TOKENS, (), "bench", Sampling(temperature=0))
        began = time.perf_counter()
        first = None
        count = 0
        async for chunk in backend.generate(request):
            if first is None:
                first = time.perf_counter() - began
                count -= 1
            count += len(chunk.tokens)
        assert first is not None
        return first, time.perf_counter() - began - first, count

    def prompt() -> list[int]:
        return rng.integers(0, 199_000, size=PROMPT_TOKENS).tolist()

    await generate(prompt()[:16])  # warm-up
    ttft, rest, count = await generate(prompt())
    started = time.perf_counter()
    together = await asyncio.gather(*(generate(prompt()) for _ in range(4)))
    batch4 = sum(c for _, _, c in together) / (time.perf_counter() - started - max(t for t, _, _ in together))
    await backend.aclose()
    return {"load_s": load_s, "ttft_s": ttft, "decode_b1": count / rest, "decode_b4": batch4}


RUNS = {  # by shape: how its report describes it, the report's section, make-checkpoint's extra flags
    "gpt-oss-20b": ("24 layers, 32 experts", "real_scale_bench", []),
    "gpt-oss-120b": ("36 layers, 128 experts (zero, as holes)", "real_scale_bench_120b", ["--zero-experts"]),
}


def report(figures: dict[str, float], dtype: str, shape: str) -> str:
    described, section, _ = RUNS[shape]
    start, end = markers(section)
    f = figures
    rows = [
        (f"random checkpoint written ({shape} shape, HF layout)", "make"),
        ("`gpt-oss-gateway convert`", "convert"),
        ("engine loaded and serving (peak over the whole run)", "serve"),
    ]
    table = "\n".join(
        f"| {name} | {f[key + '_s']:.0f} s | {f[key + '_rss']:.1f} | {f[key + '_anon']:.1f} |"
        if f[key + "_s"] == f[key + "_s"]  # not NaN: the phase ran in this run
        else f"| {name} | (an earlier run's checkpoint, reused) | | |"
        for name, key in rows
    )
    return f"""{start}
## The engine at the full {shape} shape (CPU)

`python bench/real_scale_bench.py --shape {shape} --dtype {dtype} --write docs/benchmarks.md` on
{platform.machine()}, {os.cpu_count()} CPUs, {f["ram_gib"]:.0f} GiB of memory: a random checkpoint of the real
shape ({described}, hidden 2880, vocabulary 201,088), converted to a {dtype} graph and served by the engine
backend with 4 KV slots of {MAX_POSITIONS} positions. Each phase is its own process (peak RSS from
`wait4`, which counts the pages of mapped files a process has read: safetensors maps the checkpoint) and
its peak anonymous memory (RssAnon, sampled every 0.1 s: what it allocated itself).

| phase | time | peak RSS (GiB) | peak anonymous (GiB) |
|---|---|---|---|
{table}

Checkpoint {f["checkpoint_gib"]:.1f} GiB ({f["checkpoint_disk_gib"]:.1f} GiB of disk blocks); graph
{f["graph_gib"]:.1f} GiB written beside it (the experts are read from the checkpoint's files). Load (session
creation with the graph cached) {f["load_s"]:.0f} s; time to first token for a {PROMPT_TOKENS}-token
prompt {f["ttft_s"]:.1f} s; decode {f["decode_b1"]:.2f} tokens/s at batch 1 and {f["decode_b4"]:.2f} tokens/s at
batch 4 (all four sequences together).
{end}"""


def memory_section() -> str:
    """Computed from the tensor specs: what the engine holds for the real models, by graph dtype."""
    from backends.engine.checkpoint import expected
    from backends.engine.config import SHAPES

    start, end = markers("real_scale_memory")
    rows = []
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        config = SHAPES[name]
        specs = expected(config).values()
        experts = sum(int(np.prod(s.shape)) for s in specs if s.dtype == "U8")
        other = sum(int(np.prod(s.shape)) for s in specs if s.dtype != "U8")
        kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
        for dtype, size in (("float32", 4), ("bfloat16 / float16", 2)):
            weights = experts + other * size
            kv = kv_per_token * 1024 * size
            rows.append(
                f"| {name} | {dtype} | {experts / 1024**3:.1f} | {other * size / 1024**3:.1f} | "
                f"{weights / 1024**3:.1f} | {kv / 1024**2:.0f} |"
            )
    table = "\n".join(rows)
    return f"""{start}
## Engine memory for the real models (computed)

From the checkpoint tensor specs (`backends/engine/checkpoint.expected`, whose parameter counts a test
checks against the published 20.91 B and 116.83 B). The MXFP4 experts stay 4-bit codes with 1-byte
scales in every dtype; everything else takes the graph's dtype. KV is per sequence: every layer keeps
`max_positions` (the sliding-window layers too; see docs/backends.md), so 1k tokens of one sequence
cost the figure below, times `max_batch` slots. Written by `python bench/real_scale_bench.py --memory`.

| model | graph dtype | experts (GiB) | other weights (GiB) | weights (GiB) | KV per 1k tokens per sequence (MiB) |
|---|---|---|---|---|---|
{table}
{end}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--shape", default="gpt-oss-20b", choices=tuple(RUNS))
    parser.add_argument("--workdir", help="where the checkpoint and graph go (default: a temporary directory)")
    parser.add_argument("--write", help="update this markdown file's real_scale_bench section")
    parser.add_argument("--memory", action="store_true", help="only write the computed memory table")
    parser.add_argument("--serve", nargs=2, metavar=("CHECKPOINT", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        print(json.dumps(asyncio.run(_serve(args.serve[0], args.serve[1], args.dtype))))
        return
    if args.memory:
        section = memory_section()
        print(section)
        if args.write:
            write_section(Path(args.write), "real_scale_memory", section)
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="real-scale-"))
    checkpoint, cache = work / "checkpoint", work / "cache"
    cli = [sys.executable, "-m", "gateway.cli"]
    figures: dict[str, float] = {"ram_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3}
    try:
        if not (checkpoint / "config.json").is_file():
            make = [*cli, "make-checkpoint", str(checkpoint), "--shape", args.shape, "--layout", "hf"]
            make += RUNS[args.shape][2]
            figures["make_s"], figures["make_rss"], figures["make_anon"], _ = _run(make)
        else:
            figures["make_s"] = figures["make_rss"] = figures["make_anon"] = float("nan")
        convert = [*cli, "convert", str(checkpoint), "--dtype", args.dtype, "--cache-dir", str(cache)]
        converted = _run([*convert, "--max-positions", str(MAX_POSITIONS)])
        figures["convert_s"], figures["convert_rss"], figures["convert_anon"], _ = converted
        figures["checkpoint_gib"], figures["graph_gib"] = _size_gib(checkpoint), _size_gib(cache, written=True)
        figures["checkpoint_disk_gib"] = _size_gib(checkpoint, blocks=True)
        serve = [sys.executable, __file__, "--dtype", args.dtype, "--serve", str(checkpoint), str(cache)]
        figures["serve_s"], figures["serve_rss"], figures["serve_anon"], out = _run(serve)
        figures.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    if args.write:
        write_section(Path(args.write), RUNS[args.shape][1], report(figures, args.dtype, args.shape))


if __name__ == "__main__":
    main()
