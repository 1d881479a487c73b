"""What the event loop is worth: short non-streamed requests per second through the mock backend, one gateway
on uvloop and one on asyncio's own loop (GATEWAY_EVENT_LOOP), loaded in alternating rounds of one run (the
order rotated each round, each round starting once the gateway before it is idle). With two CPUs or
more, every gateway thread is pinned to the last CPU and the load client to the others; uvloop's figure
against asyncio is the median of the per-round ratios.

    python bench/event_loop_bench.py [--clients 50] [--duration 32] [--rounds 16] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from live_gateway import GatewayProcess  # noqa: E402
from pinned_rounds import Rounds, pinned_rounds  # noqa: E402
from pinned_rounds import main as rounds_main  # noqa: E402
from report import markers  # noqa: E402

NAME = "event_loop_bench"
LOOPS = ("asyncio", "uvloop")


def run(args: argparse.Namespace) -> Rounds:
    def announced(name: str, gateway: GatewayProcess) -> None:
        if f"(event loop: {name})" not in gateway.log_text():
            raise RuntimeError(f"the {name} gateway did not announce its loop as {name}")

    settings = {name: {"GATEWAY_EVENT_LOOP": name} for name in LOOPS}
    return pinned_rounds(settings, "asyncio", args.clients, args.duration, args.rounds, announced)


def report(figures: Rounds, args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    placement = (
        "every gateway thread pinned to one CPU and the load client to the other(s)"
        if figures.pinned
        else "gateways and load client sharing the CPU"
    )
    return "\n".join(
        [
            start,
            "## What the event loop is worth (`bench/event_loop_bench.py`)",
            "",
            f"{os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, the mock backend,"
            f" short non-streamed Responses requests from {args.clients} closed-loop clients, {args.rounds}"
            f" alternating rounds of {args.duration / args.rounds:.0f} s per loop in one run, {placement}."
            " uvloop against asyncio: the median of the per-round ratios.",
            "",
            "| event loop | requests/s | against asyncio |",
            "|---|---|---|",
            f"| asyncio | {figures.rates['asyncio']:,.0f} | 1.000x |",
            f"| uvloop (the default) | {figures.rates['uvloop']:,.0f} | {figures.against['uvloop']:.3f}x |",
            end,
        ]
    )


if __name__ == "__main__":
    rounds_main(__doc__, NAME, run, report, 32.0, 16)
