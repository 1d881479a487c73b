"""One tenant's costly requests against another tenant's ordinary ones, on one `serve` process (the scripted
mock backend, API keys on): the ordinary tenant's latency alone, then while the costly tenant keeps PARALLEL
requests of large tool lists in flight (MiBs of JSON Schema each: parsed, checked and rendered as that tenant's
costly work), with large bodies checked in checker processes (the default) and, in the same run, in the
gateway's own threads. Reported: the ordinary tenant's p50/p99 in both phases and their ratio (the target: p99
within 2x of its own unloaded p99), the costly requests answered, and the gateway's event-loop stalls over 50 ms.
For reference: tenant A beside one CPU-bound process of normal priority.

    python bench/costly_tenant_bench.py [--seconds 20] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from gateway_fixtures import KEY_SECRET, write_keys  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from report import markers, write_section  # noqa: E402

NAME = "costly_tenant_bench"
MODEL = "gpt-oss-120b"
PARALLEL = 10
ORDINARY_CLIENTS = 2
SCRIPT = {"rules": [{"emit": [{"final": "ok"}]}]}


def costly_body() -> bytes:
    """About 3 MiB: 40 tools of 1,200 properties each (under every schema limit, each schema checked)."""
    fields = {f"field_{n}": {"type": "string", "description": "d" * 30} for n in range(1_200)}
    tools = [{"type": "function", "name": f"tool_{n}", "parameters": {"type": "object", "properties": fields}}
             for n in range(40)]  # fmt: skip
    return json.dumps({"model": MODEL, "input": "hi", "tools": tools, "max_output_tokens": 16}).encode()


def _post(url: str, key: str, body: bytes) -> float:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    request = urllib.request.Request(url + "/v1/responses", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()
    except urllib.error.HTTPError as exc:  # a 400 (the tools overflow the context) is an answer too
        exc.read()
    return time.perf_counter() - started


def _loop(url: str, key: str, body: bytes, until: float, out: list[float]) -> None:
    while time.monotonic() < until:
        out.append(_post(url, key, body))


def phase(url: str, seconds: float, costly: bytes | None) -> tuple[list[float], int]:
    """The ordinary tenant's latencies over `seconds`, and the costly requests answered meanwhile."""
    until = time.monotonic() + seconds
    ordinary: list[float] = []
    answered: list[float] = []
    small = json.dumps({"model": MODEL, "input": "hello"}).encode()
    threads = [threading.Thread(target=_loop, args=(url, "sk-tenant-a", small, until, ordinary))
               for _ in range(ORDINARY_CLIENTS)]  # fmt: skip
    if costly is not None:
        threads += [threading.Thread(target=_loop, args=(url, "sk-tenant-b", costly, until, answered))
                    for _ in range(PARALLEL)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ordinary, len(answered)


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def loop_stalls(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith("gateway_event_loop")}
    return samples["gateway_event_loop_lag_seconds_count"] - samples['gateway_event_loop_lag_seconds_bucket{le="0.05"}']


def measure(mode: str, seconds: float) -> dict:
    """One gateway, large bodies checked by `mode` ("checkers": idle-priority processes; "threads": the
    gateway's own paced threads): tenant A alone, then beside tenant B."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / "script.json").write_text(json.dumps(SCRIPT))
        env = {
            "GATEWAY_MOCK_SCRIPT": str(directory / "script.json"),
            "GATEWAY_KEY_SECRET": KEY_SECRET,
            "GATEWAY_KEYS_FILE": str(write_keys(directory)),
            "GATEWAY_METRICS_PUBLIC": "1",
            "GATEWAY_REQUEST_CHECKERS": "1" if mode == "checkers" else "0",
        }
        gateway = GatewayProcess(env, directory / "gateway.log").start()
        try:
            phase(gateway.url, 2.0, None)  # warm-up
            alone, _ = phase(gateway.url, seconds, None)
            stalls_before = loop_stalls(gateway.url)
            loaded, costly_answered = phase(gateway.url, seconds, costly_body())
            stalls = loop_stalls(gateway.url) - stalls_before
            figures = {"alone_p50": p(alone, 50), "alone_p99": p(alone, 99), "loaded_p50": p(loaded, 50),
                       "loaded_p99": p(loaded, 99), "requests_alone": len(alone), "requests_loaded": len(loaded),
                       "costly_answered": costly_answered, "stalls": stalls}  # fmt: skip
            if mode == "checkers":
                burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                try:
                    beside_cpu, _ = phase(gateway.url, seconds, None)
                finally:
                    burner.kill()
                figures |= {"cpu_p50": p(beside_cpu, 50), "cpu_p99": p(beside_cpu, 99)}
        finally:
            gateway.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    figures = {mode: measure(mode, args.seconds) for mode in ("threads", "checkers")}
    figures["costly_mib"] = len(costly_body()) / 2**20
    print(json.dumps(figures, indent=1))
    section = report(figures, args.seconds)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


def report(f: dict, seconds: float) -> str:
    start, end = markers(NAME)
    t, c = f["threads"], f["checkers"]

    def row(name: str, unit: str = " ms", digits: int = 1) -> str:
        cells = [f"{m[f'alone_{name}']:.{digits}f}{unit} → {m[f'loaded_{name}']:.{digits}f}{unit}" for m in (t, c)]
        ratios = [m[f"loaded_{name}"] / m[f"alone_{name}"] for m in (t, c)]
        return f"| {name} | {cells[0]} | {ratios[0]:.2f}x | {cells[1]} | **{ratios[1]:.2f}x** |"

    cpu = f"{c['cpu_p50']:.1f} / {c['cpu_p99']:.1f} ms"
    cpu += f" ({c['cpu_p50'] / c['alone_p50']:.2f}x / {c['cpu_p99'] / c['alone_p99']:.2f}x)"
    return f"""{start}
## One tenant's costly requests beside another's ordinary ones (`bench/costly_tenant_bench.py`)

{os.cpu_count()} CPUs ({platform.machine()}), one `serve` process with the mock backend and API keys, {seconds:g} s a
phase, both ways in one run. Tenant A: {ORDINARY_CLIENTS} clients of short requests back to back. Tenant B, in the
loaded phase: {PARALLEL} clients each keeping one request of {f["costly_mib"]:.1f} MiB of tool schemas in flight
(40 tools of 1,200 properties: each body parsed, schema-checked and rendered, then refused as past the context).
"threads": large bodies decoded and checked in the gateway's own paced worker threads
(`GATEWAY_REQUEST_CHECKERS=0`); "checkers": in idle-priority checker processes first (the default).

| tenant A | threads: alone → beside B | ratio | checkers: alone → beside B | ratio (target: p99 within 2x) |
|---|---|---|---|---|
{row("p50")}
{row("p99")}

Requests tenant A got answered alone / beside B: threads {t["requests_alone"]} / {t["requests_loaded"]}, checkers
{c["requests_alone"]} / {c["requests_loaded"]}. Tenant B's costly requests answered meanwhile: threads
{t["costly_answered"]}, checkers {c["costly_answered"]}. Event-loop stalls past 50 ms in the loaded phase
(`gateway_event_loop_lag_seconds`): threads {t["stalls"]:.0f}, checkers {c["stalls"]:.0f}. For reference, tenant A
beside a CPU-bound process at normal priority (checkers' gateway): p50 / p99 {cpu}.
{end}"""


if __name__ == "__main__":
    main()
