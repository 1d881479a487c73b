"""500 concurrent SSE streams on loopback against a `serve` process with a paced mock backend: time to
first token and inter-token latency percentiles, errors, and the gateway's CPU time.

    python bench/load_test.py [--streams 500] [--tokens 60] [--delay-ms 50] [--write docs/reliability.md]

The mock emits one token every `delay-ms` per stream, so the gateway's own cost is what the latencies
add to that pacing. The client runs in this process, the gateway in its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from closed_loop import cpu_seconds  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from report import markers, write_section  # noqa: E402
from sse_load import LoadResult, mock_script, run_load  # noqa: E402

NAME = "load_test"


def run(streams: int, tokens: int, delay_ms: int) -> tuple[LoadResult, LoadResult, float]:
    """(one stream alone, then `streams` at once, and the gateway's CPU seconds for the latter)."""
    with tempfile.TemporaryDirectory(prefix="load-") as scratch:
        script = Path(scratch) / "script.json"
        answer = " ".join(f"w{i}" for i in range(tokens))
        script.write_text(json.dumps(mock_script(answer, delay_ms)))
        env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script)}
        gateway = GatewayProcess(env, Path(scratch) / "gateway.log").start()
        try:
            assert gateway.process is not None
            alone = asyncio.run(run_load(gateway.url, 1, "gpt-oss-120b"))
            cpu_before = cpu_seconds(gateway.process.pid)
            result = asyncio.run(run_load(gateway.url, streams, "gpt-oss-120b"))
            return alone, result, cpu_seconds(gateway.process.pid) - cpu_before
        finally:
            gateway.stop()


def report(alone: LoadResult, result: LoadResult, gateway_cpu_s: float, streams: int, delay_ms: int) -> str:
    start, end = markers(NAME)

    def ms(values: dict[str, float]) -> str:
        return " | ".join(f"{values[k] * 1e3:,.1f} ms" for k in ("p50", "p90", "p99", "max"))

    lines = [
        start,
        "## Concurrent SSE streams (`bench/load_test.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; client and "
        f"gateway on the same machine (loopback). {streams} Responses streams opened at once; the mock backend "
        f"paces {result.tokens // max(1, len(result.streams)):,} answer tokens per stream at one per {delay_ms} ms.",
        "",
        "| measure | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        f"| time to first answer token, one stream alone | {ms(alone.ttft)} |",
        f"| time to first answer token, {streams} streams | {ms(result.ttft)} |",
        f"| inter-token latency, one stream alone | {ms(alone.inter_token)} |",
        f"| inter-token latency, {streams} streams | {ms(result.inter_token)} |",
        "",
        "The mock paces every token, the answer's header tokens included, so a lone stream's figures are the "
        f"floor; what {streams} streams add to them is the gateway's (and this client's) cost under load.",
        "",
        f"Errors: {len(result.errors)} of {len(result.streams)} streams. Tokens delivered: {result.tokens:,} in "
        f"{result.wall_s:.1f} s ({result.tokens / result.wall_s:,.0f} tok/s); the gateway process used "
        f"{gateway_cpu_s:.1f} CPU s ({result.tokens / max(gateway_cpu_s, 1e-9):,.0f} tokens per CPU second).",
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--delay-ms", type=int, default=50)
    parser.add_argument("--write", type=Path, help="markdown file whose load-test section is replaced")
    args = parser.parse_args()
    alone, result, cpu = run(args.streams, args.tokens, args.delay_ms)
    section = report(alone, result, cpu, args.streams, args.delay_ms)
    print(section)
    if result.errors:
        print("first errors:", result.errors[:3], file=sys.stderr)
    if args.write:
        write_section(args.write, NAME, section, title="Reliability")


if __name__ == "__main__":
    main()
