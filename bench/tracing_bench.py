"""What tracing costs the gateway: short non-streamed requests per second through the mock backend with traces
off, on and kept at 1% (`parentbased_traceidratio`), and on at 100%, exporting to an OTLP receiver in this
process that accepts and drops them, in alternating rounds of one run.

    python bench/tracing_bench.py [--clients 50] [--duration 12] [--rounds 3] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from closed_loop import Load, LoopResult, closed_loop  # noqa: E402
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


def run(args: argparse.Namespace) -> dict[str, float]:
    sink = OtlpReceiver(keep_spans=False).start()
    scratch = Path(tempfile.mkdtemp(prefix="tracing-bench-"))
    script = scratch / "script.json"
    script.write_text(json.dumps({"rules": [{"emit": [{"raw": SHORT}]}]}))
    gateways: dict[str, GatewayProcess] = {}
    results: dict[str, list[LoopResult]] = {name: [] for name in SETTINGS}
    try:
        for name, extra in SETTINGS.items():
            env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), **extra}
            if name != "off":
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
            gateways[name] = GatewayProcess(env, scratch / f"{name[:6].strip(',')}.log").start()
        load = Load(request_body(False), args.clients, args.duration / args.rounds)
        for _ in range(args.rounds):
            for name, gateway in gateways.items():
                assert gateway.process is not None
                results[name].append(closed_loop(gateway.url + "/v1/responses", gateway.process.pid, load))
    finally:
        for gateway in gateways.values():
            gateway.stop()
        sink.stop()
    if not sink.exports:
        raise RuntimeError("no spans reached the receiver: tracing was not on")
    rates = {}
    for name, rounds in results.items():
        errors = [error for result in rounds for error in result.errors]
        if errors:
            raise RuntimeError(f"{name}: {errors[:3]}")
        rates[name] = sum(len(r.latencies_s) for r in rounds) / sum(r.wall_s for r in rounds)
    return rates


def report(rates: dict[str, float], args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    off = rates["off"]
    lines = [
        start,
        "## What tracing costs (`bench/tracing_bench.py`)",
        "",
        f"{os.cpu_count()} CPUs ({platform.machine()}), the mock backend, short non-streamed Responses requests from"
        f" {args.clients} closed-loop clients, {args.rounds} alternating rounds of {args.duration / args.rounds:.0f} s"
        " per setting in one run; spans exported over OTLP/HTTP to a receiver that drops them.",
        "",
        "| tracing | requests/s | against off |",
        "|---|---|---|",
        *(f"| {name} | {rate:,.0f} | {rate / off:.3f}x |" for name, rate in rates.items()),
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    section = report(run(args), args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
