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
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from closed_loop import Load, LoopResult, closed_loop, pin_threads, wait_idle  # noqa: E402
from gateway_bench import SHORT, request_body  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402
from report import markers, write_section  # noqa: E402

NAME = "tracing_bench"
SETTINGS = {
    "off": {},
    "on, 1% kept": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "on, 100% kept": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


@dataclass
class Figures:
    rates: dict[str, float]  # requests/s over all rounds
    against_off: dict[str, float]  # median of the per-round ratios to off
    pinned: bool


def run(args: argparse.Namespace) -> Figures:
    sink = OtlpReceiver(keep_spans=False).start()
    scratch = Path(tempfile.mkdtemp(prefix="tracing-bench-"))
    script = scratch / "script.json"
    script.write_text(json.dumps({"rules": [{"emit": [{"raw": SHORT}]}]}))
    gateways: dict[str, GatewayProcess] = {}
    results: dict[str, list[LoopResult]] = {name: [] for name in SETTINGS}
    own_cpus = os.sched_getaffinity(0)
    pinned = len(own_cpus) >= 2
    try:
        for name, extra in SETTINGS.items():
            env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), **extra}
            if name != "off":
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
            gateways[name] = GatewayProcess(env, scratch / f"{name[:6].strip(',')}.log").start()
            if pinned:
                assert gateways[name].process is not None
                pin_threads(gateways[name].process.pid, max(own_cpus))
        if pinned:
            os.sched_setaffinity(0, own_cpus - {max(own_cpus)})
        load = Load(request_body(False), args.clients, args.duration / args.rounds)
        for round_index in range(args.rounds):
            shift = round_index % len(gateways)
            order = [*gateways.items()][shift:] + [*gateways.items()][:shift]
            for name, gateway in order:
                assert gateway.process is not None
                results[name].append(closed_loop(gateway.url + "/v1/responses", gateway.process.pid, load))
                wait_idle(gateway.process.pid)
    finally:
        os.sched_setaffinity(0, own_cpus)
        for gateway in gateways.values():
            gateway.stop()
        sink.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if not sink.exports:
        raise RuntimeError("no spans reached the receiver: tracing was not on")
    rates, against_off = {}, {}
    for name, rounds in results.items():
        errors = [error for result in rounds for error in result.errors]
        if errors:
            raise RuntimeError(f"{name}: {errors[:3]}")
        rates[name] = sum(len(r.latencies_s) for r in rounds) / sum(r.wall_s for r in rounds)
        ratios = [r.request_rate / off.request_rate for r, off in zip(rounds, results["off"], strict=True)]
        against_off[name] = statistics.median(ratios)
    return Figures(rates, against_off, pinned)


def report(figures: Figures, args: argparse.Namespace) -> str:
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
        *(f"| {name} | {rate:,.0f} | {figures.against_off[name]:.3f}x |" for name, rate in figures.rates.items()),
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=24.0)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    section = report(run(args), args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
