"""The engine's ONNX Runtime threads spinning between operators, against sleeping, in one run.

    python bench/spinning_bench.py [--rounds 10] [--write docs/benchmarks.md]

The engine runs two ONNX Runtime sessions, each with its own intra-op pool of one thread a core: the decoder's
and the sampler's (SampleTokens over the logits). A pool whose threads spin keeps its cores busy for a while
after its own work, while the other pool, or the gateway's event loop in the same process, needs them. The
sampler's pool sleeps; the engine option `spinning` chooses for the decoder's. Three ways, through the engine
backend as the gateway runs it (a random checkpoint of the real vocabulary, 201,088, at small widths;
`max_batch` 8; greedy): both pools spinning (ONNX Runtime's default, as the engine ran before), the decoder's
spinning (`spinning: true`), both sleeping (the default). Figures: one request decoding 200 tokens; eight at
once decoding 128 each; one 2,000-token prompt's prefill. The ways alternate for `--rounds` rounds; the table
holds each figure's median.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from engine_bench import generated_tokens  # noqa: E402
from engine_fixtures import make_checkpoint, tiny_config  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402

from backends.engine import runtime  # noqa: E402
from backends.engine.backend import EngineBackend, EngineOptions  # noqa: E402
from backends.engine.sampling_session import SamplingSession  # noqa: E402
from harmony import load_harmony_encoding  # noqa: E402

NAME = "spinning_bench"
FIGURES = {
    "decode, 1 request (tok/s)": "one",
    "decode, 8 at once (tok/s)": "eight",
    "prefill, 2,000 tokens (tok/s)": "prefill",
}
# way → (the decoder's pool spins, the sampler's pool spins)
WAYS = {
    "both spinning (before)": (True, True),
    "the decoder's spinning (`spinning: true`)": (True, False),
    "both sleeping (the default)": (False, False),
}


def measure(checkpoint: Path, cache: Path, spinning: bool, sampler_spinning: bool) -> dict[str, float]:
    """Tokens a second for each figure, on a fresh engine."""
    runtime.SamplingSession = functools.partial(SamplingSession, spinning=sampler_spinning)

    async def scenario() -> dict[str, float]:
        options = EngineOptions(
            checkpoint=str(checkpoint), max_batch=8, max_positions=4096, cache_dir=str(cache), spinning=spinning
        )
        backend = EngineBackend(options, load_harmony_encoding())
        rng = np.random.default_rng(0)

        def prompt(length: int) -> list[int]:
            return rng.integers(0, 199_000, length).tolist()

        try:
            await generated_tokens(backend, prompt(32), 2)  # load and warm up
            started = time.perf_counter()
            one = await generated_tokens(backend, prompt(64), 200) / (time.perf_counter() - started)
            prompts = [prompt(64) for _ in range(8)]
            started = time.perf_counter()
            eight = sum(await asyncio.gather(*(generated_tokens(backend, p, 128) for p in prompts)))
            eight /= time.perf_counter() - started
            started = time.perf_counter()
            await generated_tokens(backend, prompt(2000), 1)
            prefill = 2000 / (time.perf_counter() - started)
        finally:
            await backend.aclose()
        return {"one": one, "eight": eight, "prefill": prefill}

    return asyncio.run(scenario())


def render(medians: dict[str, dict[str, float]], rounds: int) -> str:
    start, end = markers(NAME)
    before, *others = WAYS
    lines = [
        start,
        "## The engine's threads spinning or sleeping between operators (`bench/spinning_bench.py`)",
        "",
        f"CPU: {cpu_line()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. The built-in engine (a random checkpoint of the real vocabulary, 201,088, at "
        f"small widths; `max_batch` 8; greedy); its decoder's and its sampler's ONNX Runtime pools spinning between "
        f"operators or sleeping; medians of {rounds} alternating rounds, each way over both spinning.",
        "",
        f"| figure | {' | '.join(WAYS)} |",
        "|---|---|---|---|",
    ]
    for label, key in FIGURES.items():
        cells = [f"{medians[before][key]:,.0f}"]
        cells += [f"{medians[way][key]:,.0f} (**{medians[way][key] / medians[before][key]:.2f}x**)" for way in others]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines.append(end)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = make_checkpoint(Path(directory) / "model", tiny_config(), "original")
        for _ in range(args.rounds):
            for way, (spinning, sampler_spinning) in WAYS.items():
                runs[way].append(measure(checkpoint, Path(directory) / "cache", spinning, sampler_spinning))
    medians = {
        way: {key: statistics.median(run[key] for run in measured) for key in FIGURES.values()}
        for way, measured in runs.items()
    }
    section = render(medians, args.rounds)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
