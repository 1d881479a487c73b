"""The host's cost per decode step as the engine serves (issue 62, section 4): engine_check's `host` step.

A random checkpoint of gpt-oss-20b's width and vocabulary (hidden 2,880, 201,088 tokens) at a few layers, served
by the engine backend in-process (the scheduler, the runtime and the sampler as serving runs them) on the device
asked for; `batch` requests of the same 128-token prompt decode together, and between the step where every one has
its first tokens and the step where the first one ends, backends/engine/host_costs.py's counts give, per
scheduler step: its time, the host's part of it (the step's time outside the session runs: scheduling, the inputs,
the sampler's rows, the bookkeeping), the session runs launched, the host's waits for the device's results, and the
bytes of host inputs.

    python bench/host_costs_check.py [--device cpu] [--layers 2] [--write docs/benchmarks.md]

On the CPU between GPU windows, so that a regression of the host's share shows before the next GPU; the docs'
section is this run's (the GPU's figures come with engine_check's section).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from engine_check_report import host_lines  # noqa: E402
from engine_fixtures import loaded  # noqa: E402
from report import cpu_line, write_section  # noqa: E402

from backends.base import GenerateRequest, Sampling  # noqa: E402
from backends.engine.backend import EngineBackend, EngineOptions  # noqa: E402
from backends.engine.config import GPT_OSS_20B, ModelConfig  # noqa: E402
from backends.engine.host_costs import HostCosts  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402
from harmony import load_harmony_encoding  # noqa: E402

PROMPT_TOKENS = 128
SETTLE_TOKENS = 4  # tokens every request has before the counted steps (their prompts all in, each decoding)


async def decode_costs(engine: EngineBackend, batch: int, tokens: int) -> dict[str, float]:
    """`batch` requests decoding together: the costs per scheduler step over their common decode steps."""
    produced = [0] * batch
    marks: dict[str, HostCosts] = {}
    prompt = [200006, 17360, 200008, *((i * 7919) % 50_000 + 100 for i in range(PROMPT_TOKENS))]

    async def one(index: int) -> None:
        request = GenerateRequest(prompt, tokens, (), f"host-{batch}-{index}", sampling=Sampling(temperature=0))
        async for chunk in engine.generate(request):
            produced[index] += len(chunk.tokens)
            if "start" not in marks and min(produced) >= SETTLE_TOKENS:
                marks["start"] = engine.host_costs()
            if "end" not in marks and produced[index] >= tokens - 1:
                marks["end"] = engine.host_costs()

    await asyncio.gather(*(one(index) for index in range(batch)))
    return marks["end"].per_loop(marks["start"])


async def measure(checkpoint: Path, device: str, work: Path, batches: tuple[int, ...], tokens: int) -> dict:
    report: dict[str, Any] = {}
    for batch in batches:
        options = EngineOptions(
            checkpoint=str(checkpoint), device=device, max_batch=batch, max_positions=1024, cache_dir=str(work)
        )
        engine = await loaded(EngineBackend(options, load_harmony_encoding()), timeout_s=1800)
        try:
            await decode_costs(engine, batch, 8)  # warm: the first runs of each shape
            report[f"batch_{batch}"] = await decode_costs(engine, batch, tokens)
        finally:
            await engine.aclose()
    return report


def host_costs(work: Path, device: str, layers: int = 2, batches: tuple[int, ...] = (1, 8), tokens: int = 64) -> dict:
    """The host's figures per decode step at each batch (see the module's docstring)."""
    config: ModelConfig = replace(GPT_OSS_20B, num_hidden_layers=layers)
    checkpoint = write_random_checkpoint(work / "host-costs", config, "original", seed=11)
    report = asyncio.run(measure(checkpoint, device, work / "host-costs-graphs", batches, tokens))
    return {"device": device, "cpu": cpu_line(), "layers": layers, "prompt_tokens": PROMPT_TOKENS, **report}


NAME = "host_costs_check"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        figures = host_costs(Path(work), args.device, args.layers)
    print(json.dumps(figures, indent=1))
    lines = host_lines(figures)
    title = "## The host's cost per decode step (`bench/host_costs_check.py`)"
    section = "\n".join([f"<!-- {NAME}:start -->", title, "", *lines[:-1], f"<!-- {NAME}:end -->"])
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
