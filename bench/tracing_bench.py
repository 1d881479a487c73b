"""What tracing costs the gateway: short non-streamed requests per second through the mock backend with traces
off, on and kept at 1% (`parentbased_traceidratio`), and on at 100%, exporting to an OTLP receiver in this
process that accepts and drops them, in alternating rounds of one run, each round starting once the gateway
before it is idle (done exporting). With two CPUs or more, every gateway
thread is pinned to the last CPU and the load client to the others, so no setting shares its core with the
client; each setting's figure against off is the median of its per-round ratios (the order of the settings
rotated each round).

    python bench/tracing_bench.py [--clients 50] [--duration 24] [--rounds 12] [--write docs/benchmarks.md]
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

from otlp_receiver import OtlpReceiver  # noqa: E402
from pinned_rounds import Rounds, pinned_rounds  # noqa: E402
from pinned_rounds import main as rounds_main  # noqa: E402
from report import markers  # noqa: E402

NAME = "tracing_bench"
SETTINGS = {
    "off": {},
    "on, 1% kept": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "on, 100% kept": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


def run(args: argparse.Namespace) -> Rounds:
    sink = OtlpReceiver(keep_spans=False).start()
    settings = {
        name: {**extra, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url} if name != "off" else extra
        for name, extra in SETTINGS.items()
    }
    try:
        figures = pinned_rounds(settings, "off", args.clients, args.duration, args.rounds)
    finally:
        sink.stop()
    if not sink.exports:
        raise RuntimeError("no spans reached the receiver: tracing was not on")
    return figures


def report(figures: Rounds, args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    placement = (
        "every gateway thread pinned to one CPU and the load client to the other(s)"
        if figures.pinned
        else "gateways and load client sharing the CPU"
    )
    lines = [
        start,
        "## What tracing costs (`bench/tracing_bench.py`)",
        "",
        f"{os.cpu_count()} CPUs ({platform.machine()}), the mock backend, short non-streamed Responses requests from"
        f" {args.clients} closed-loop clients, {args.rounds} alternating rounds of {args.duration / args.rounds:.0f} s"
        f" per setting in one run, {placement}; spans exported over OTLP/HTTP to a receiver that drops them."
        " Against off: the median of the per-round ratios.",
        "",
        "| tracing | requests/s | against off |",
        "|---|---|---|",
        *(f"| {name} | {rate:,.0f} | {figures.against[name]:.3f}x |" for name, rate in figures.rates.items()),
        end,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    rounds_main(__doc__, NAME, run, report, 24.0, 12)
