"""What the event loop is worth: short non-streamed requests per second through the mock backend, one gateway
on uvloop and one on asyncio's own loop (GATEWAY_EVENT_LOOP), loaded in alternating rounds of one run (the
order reversed every other round, each round starting once the gateway before it is idle). With two CPUs or
more, every gateway thread is pinned to the last CPU and the load client to the others; uvloop's figure
against asyncio is the median of the per-round ratios.

    python bench/event_loop_bench.py [--clients 50] [--duration 32] [--rounds 16] [--write docs/benchmarks.md]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from closed_loop import Load, LoopResult, closed_loop, pin_threads, wait_idle  # noqa: E402
from gateway_bench import SHORT, request_body  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from report import markers, write_section  # noqa: E402

NAME = "event_loop_bench"
LOOPS = ("asyncio", "uvloop")


def run(args: argparse.Namespace) -> tuple[dict[str, float], float, bool]:
    """(requests/s per loop over all rounds, uvloop's median per-round ratio to asyncio, pinned)."""
    scratch = Path(tempfile.mkdtemp(prefix="event-loop-bench-"))
    script = scratch / "script.json"
    script.write_text(json.dumps({"rules": [{"emit": [{"raw": SHORT}]}]}))
    gateways: dict[str, GatewayProcess] = {}
    results: dict[str, list[LoopResult]] = {name: [] for name in LOOPS}
    own_cpus = os.sched_getaffinity(0)
    pinned = len(own_cpus) >= 2
    try:
        for name in LOOPS:
            env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_EVENT_LOOP": name}
            gateway = GatewayProcess(env, scratch / f"{name}.log").start()
            gateways[name] = gateway
            if f"(event loop: {name})" not in gateway.log_text():
                raise RuntimeError(f"the {name} gateway did not announce its loop as {name}")
            if pinned:
                assert gateway.process is not None
                pin_threads(gateway.process.pid, max(own_cpus))
        if pinned:
            os.sched_setaffinity(0, own_cpus - {max(own_cpus)})
        load = Load(request_body(False), args.clients, args.duration / args.rounds)
        for round_index in range(args.rounds):
            order = LOOPS if round_index % 2 == 0 else LOOPS[::-1]
            for name in order:
                process = gateways[name].process
                assert process is not None
                results[name].append(closed_loop(gateways[name].url + "/v1/responses", process.pid, load))
                wait_idle(process.pid)
    finally:
        os.sched_setaffinity(0, own_cpus)
        for gateway in gateways.values():
            gateway.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    for name, rounds in results.items():
        errors = [error for result in rounds for error in result.errors]
        if errors:
            raise RuntimeError(f"{name}: {errors[:3]}")
    rates = {
        name: sum(len(r.latencies_s) for r in rounds) / sum(r.wall_s for r in rounds)
        for name, rounds in results.items()
    }
    pairs = zip(results["uvloop"], results["asyncio"], strict=True)
    return rates, statistics.median(u.request_rate / a.request_rate for u, a in pairs), pinned


def report(rates: dict[str, float], ratio: float, pinned: bool, args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    placement = (
        "every gateway thread pinned to one CPU and the load client to the other(s)"
        if pinned
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
            f"| asyncio | {rates['asyncio']:,.0f} | 1.000x |",
            f"| uvloop (the default) | {rates['uvloop']:,.0f} | {ratio:.3f}x |",
            end,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=32.0)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    section = report(*run(args), args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
