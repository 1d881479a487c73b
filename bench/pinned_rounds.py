"""Gateways with different settings loaded in alternating rounds of one run: short non-streamed Responses
requests through the mock backend from closed-loop clients, the order of the settings rotated each round and
each round started once the gateway before it is back to its unloaded CPU use. With two CPUs or more, every
gateway thread is pinned to the last CPU and the load client to the others. Used by bench/tracing_bench.py and
bench/event_loop_bench.py."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from closed_loop import Load, LoopResult, closed_loop, idle_rate, pin_threads, wait_idle
from gateway_bench import SHORT, request_body
from live_gateway import GatewayProcess
from report import write_section


@dataclass
class Rounds:
    rates: dict[str, float]  # requests/s over all rounds, per setting
    against: dict[str, float]  # per setting: the median of its per-round ratios to the baseline's
    pinned: bool


def pinned_rounds(
    settings: dict[str, dict[str, str]],
    baseline: str,
    clients: int,
    duration_s: float,
    rounds: int,
    started: Callable[[str, GatewayProcess], None] = lambda name, gateway: None,
) -> Rounds:
    """`settings`: each name's environment beside the mock backend's; `started` sees each gateway once up."""
    scratch = Path(tempfile.mkdtemp(prefix="pinned-rounds-"))
    script = scratch / "script.json"
    script.write_text(json.dumps({"rules": [{"emit": [{"raw": SHORT}]}]}))
    gateways: dict[str, GatewayProcess] = {}
    results: dict[str, list[LoopResult]] = {name: [] for name in settings}
    own_cpus = os.sched_getaffinity(0)
    pinned = len(own_cpus) >= 2
    try:
        for index, (name, extra) in enumerate(settings.items()):
            env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), **extra}
            gateways[name] = gateway = GatewayProcess(env, scratch / f"gateway-{index}.log").start()
            assert gateway.process is not None
            started(name, gateway)
            if pinned:
                pin_threads(gateway.process.pid, max(own_cpus))
        if pinned:
            os.sched_setaffinity(0, own_cpus - {max(own_cpus)})
        unloaded = {name: idle_rate(gateway.process.pid) for name, gateway in gateways.items() if gateway.process}
        load = Load(request_body(False), clients, duration_s / rounds)
        for round_index in range(rounds):
            shift = round_index % len(gateways)
            for name, gateway in [*gateways.items()][shift:] + [*gateways.items()][:shift]:
                assert gateway.process is not None
                results[name].append(closed_loop(gateway.url + "/v1/responses", gateway.process.pid, load))
                wait_idle(gateway.process.pid, idle_s_per_s=unloaded[name])
    finally:
        os.sched_setaffinity(0, own_cpus)
        for gateway in gateways.values():
            gateway.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    rates, against = {}, {}
    for name, taken in results.items():
        errors = [error for result in taken for error in result.errors]
        if errors:
            raise RuntimeError(f"{name}: {errors[:3]}")
        rates[name] = sum(len(r.latencies_s) for r in taken) / sum(r.wall_s for r in taken)
        pairs = zip(taken, results[baseline], strict=True)
        against[name] = statistics.median(r.request_rate / base.request_rate for r, base in pairs)
    return Rounds(rates, against, pinned)


def main(
    doc: str,
    name: str,
    run: Callable[[argparse.Namespace], Rounds],
    report: Callable[[Rounds, argparse.Namespace], str],
    duration_s: float,
    rounds: int,
) -> None:
    """The command line of a pinned-rounds bench (its docstring's first line, its default load): the section
    printed, and written into --write's file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=duration_s)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    section = report(run(args), args)
    print(section)
    if args.write:
        write_section(args.write, name, section)
