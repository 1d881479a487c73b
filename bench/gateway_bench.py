"""The gateway against OpenAI's reference Responses server (`gpt-oss` package), both with an instant backend
emitting the same Harmony tokens: short non-streaming requests per second and their latency, and SSE tokens
per second and per server CPU second, at the same client concurrency in the same run. Then the latency the
gateway adds, at that concurrency, to a backend that takes a while to answer.

    python bench/gateway_bench.py --reference-python /path/to/python3.12 [--clients 50] [--duration 10]
        [--backend-ms 1000 250] [--write docs/benchmarks.md]

The reference needs Python 3.12 with `pip install gpt-oss`; it runs offline on the packaged vocabulary.
Each server is one process; the load client runs in this process (closed loops on keep-alive connections).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from closed_loop import Load, LoopResult, closed_loop, closed_loops  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from redis_servers import free_port  # noqa: E402
from reference import offline_vocab_dir  # noqa: E402
from report import markers, write_section  # noqa: E402

from harmony import load_harmony_encoding  # noqa: E402

NAME = "gateway_bench"
MODEL = "gpt-oss-120b"
SHORT = "<|channel|>analysis<|message|>The user greets me. Reply briefly.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help you today?<|return|>"  # noqa: E501
STREAM_WORDS = 256
STREAM_WARMUP_S = 6.0


def stream_completion() -> str:
    answer = " ".join(f"word{i}" for i in range(STREAM_WORDS))
    return f"<|channel|>analysis<|message|>Write the words.<|end|><|start|>assistant<|channel|>final<|message|>{answer}<|return|>"  # noqa: E501


def request_body(stream: bool) -> bytes:
    return json.dumps({"model": MODEL, "input": "Say hello.", "stream": stream}).encode()


def post_short(url: str, timeout_s: float) -> bytes:
    """One non-streaming short request; its JSON body."""
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url + "/v1/responses", data=request_body(False), headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


@dataclass
class Server:
    name: str
    url: str
    pid: int
    stop: Callable[[], None]
    event_loop: str = ""  # the gateway's, as its `listening on` line names it


def _spawn(name: str, command: list[str], env: dict[str, str], url: str, log: Path, timeout_s: float = 60) -> Server:
    """Start a server process (stdout discarded) and wait until it answers the short request."""
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr)

    def stop() -> None:
        process.terminate()
        process.wait(timeout=10)

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            post_short(url, 5)
            return Server(name, url, process.pid, stop)
        except urllib.error.HTTPError as exc:
            stop()
            raise RuntimeError(f"{name} answered {exc.code}: {exc.read()[:300]!r}") from exc
        except OSError:
            if time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.2)


def start_reference(python: str, completion: list[int], scratch: Path) -> Server:
    tokens = scratch / "tokens.json"
    tokens.write_text(json.dumps(completion))
    port = free_port()
    command = [python, str(ROOT / "bench" / "reference_server.py"), "--port", str(port), "--tokens", str(tokens)]
    # its request handler prints every prompt to stdout, which goes to /dev/null as in a quiet deployment
    env = {"TIKTOKEN_ENCODINGS_BASE": offline_vocab_dir()}
    return _spawn("reference (gpt-oss)", command, env, f"http://127.0.0.1:{port}", scratch / "reference.log")


def start_canned(body: bytes, delay_ms: int, scratch: Path) -> Server:
    path = scratch / "canned.json"
    path.write_bytes(body)
    port = free_port()
    command = [sys.executable, str(ROOT / "bench" / "canned_server.py"), "--port", str(port)]
    command += ["--delay-ms", str(delay_ms), "--body", str(path)]
    return _spawn("canned", command, {}, f"http://127.0.0.1:{port}", scratch / "canned.log")


def start_gateway(marked: str, scratch: Path, first_delay_ms: int = 0) -> Server:
    script = scratch / f"script-{first_delay_ms}.json"
    rules = [{"emit": [{"raw": marked}]}]
    script.write_text(json.dumps({"first_token_delay_ms": first_delay_ms, "rules": rules}))
    env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script)}
    gateway = GatewayProcess(env, scratch / f"gateway-{first_delay_ms}.log").start()
    assert gateway.process is not None
    named = re.search(r"\(event loop: (\w+)\)", gateway.log_text())
    loop = named.group(1) if named else "an unnamed event loop"
    return Server("gpt-oss-gateway", gateway.url, gateway.process.pid, gateway.stop, loop)


def output_text(server: Server) -> str:
    body = json.loads(post_short(server.url, 10))
    return "".join(
        part.get("text", "") for item in body["output"] if item["type"] == "message" for part in item["content"]
    )


@dataclass
class Measured:
    short: LoopResult
    stream: LoopResult


def _check(result: LoopResult, what: str) -> None:
    if result.errors:
        raise RuntimeError(f"{what}: {len(result.errors)} errors, first: {result.errors[0]}")


def merged(results: list[LoopResult]) -> LoopResult:
    """Rounds of the same measurement as one."""
    total = LoopResult()
    for r in results:
        total.latencies_s += r.latencies_s
        total.first_event_s += r.first_event_s
        total.deltas += r.deltas
        total.errors += r.errors
        total.wall_s += r.wall_s
        total.server_cpu_s += r.server_cpu_s
    return total


def throughput(args: argparse.Namespace, scratch: Path, short_tokens: list[int], stream_tokens: list[int]) -> dict:
    """Both servers' short-request and SSE rows, measured in alternating rounds so that the machine's noise
    falls on both alike."""
    starters = {
        "reference": lambda marked, tokens: start_reference(args.reference_python, tokens, scratch),
        "gateway": lambda marked, tokens: start_gateway(marked, scratch),
    }
    servers: dict[tuple[str, str], Server] = {}
    try:
        for side, start in starters.items():
            servers[side, "short"] = start(SHORT, short_tokens)
            servers[side, "stream"] = start(stream_completion(), stream_tokens)
            text = output_text(servers[side, "short"])
            if text != "Hello! How can I help you today?":
                raise RuntimeError(f"{side} answered {text!r}")
        rounds: dict[tuple[str, str], list[LoopResult]] = {key: [] for key in servers}
        loads = {
            "short": Load(request_body(False), args.clients, args.duration / args.rounds),
            # the reference's streams take seconds each: its clients' starts are spread and the window opens
            # once they are in a steady state, so that completions do not come in one wave at its edge
            "stream": Load(
                request_body(True),
                args.clients,
                args.duration / args.rounds,
                warmup_s=STREAM_WARMUP_S,
                stagger_s=STREAM_WARMUP_S - 1,
                stream=True,
            ),
        }
        for _ in range(args.rounds):
            for (side, kind), server in servers.items():
                rounds[side, kind].append(closed_loop(server.url + "/v1/responses", server.pid, loads[kind]))
    finally:
        for server in servers.values():
            server.stop()
    figures: dict = {"gateway_loop": servers["gateway", "short"].event_loop}
    for side in starters:
        short, stream = merged(rounds[side, "short"]), merged(rounds[side, "stream"])
        _check(short, f"{side} short requests")
        _check(stream, f"{side} streams")
        figures[side] = Measured(short, stream)
    return figures


def run(args: argparse.Namespace) -> dict:
    encoding = load_harmony_encoding()
    short_tokens = encoding.encode_marked(SHORT)
    stream_tokens = encoding.encode_marked(stream_completion())
    figures: dict = {"short_tokens": len(short_tokens), "stream_tokens": len(stream_tokens)}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        scratch = Path(tmp)
        figures.update(throughput(args, scratch, short_tokens, stream_tokens))
        placements = [True, False] if len(os.sched_getaffinity(0)) >= 2 else [False]
        figures["added"] = [
            added_latency(wait_ms, clients, args, scratch, isolated)
            for isolated in placements
            for clients in args.added_clients
            for wait_ms in args.backend_ms
        ]
    return figures


@dataclass
class Added:
    wait_ms: int
    clients: int
    isolated: bool  # each server alone on a core of its own, the client on the others; else side by side
    baseline: LoopResult
    gateway: LoopResult


def added_latency(wait_ms: int, clients: int, args: argparse.Namespace, scratch: Path, isolated: bool) -> Added:
    """The short request with a backend that waits `wait_ms` before answering: the gateway and a bare server
    that waits as long and returns the gateway's own answer bytes.

    Isolated: the load client (this process) keeps all CPUs but the last, both servers are pinned to the last,
    and the two are loaded in alternating rounds, so neither shares its core with the client or the other
    server. Otherwise both are loaded side by side by the same client, all three on the same CPUs."""
    wait_s = wait_ms / 1e3
    duration = args.added_duration / args.rounds if isolated else args.added_duration
    load = Load(request_body(False), clients, duration, warmup_s=1 + wait_s, stagger_s=wait_s)
    own_cpus = os.sched_getaffinity(0)
    gateway = start_gateway(SHORT, scratch, first_delay_ms=wait_ms)
    try:
        canned = start_canned(post_short(gateway.url, 10), wait_ms, scratch)
        try:
            targets = [(canned.url + "/v1/responses", canned.pid), (gateway.url + "/v1/responses", gateway.pid)]
            if isolated:
                server_cpu = max(own_cpus)
                for server in (canned, gateway):
                    os.sched_setaffinity(server.pid, {server_cpu})
                os.sched_setaffinity(0, own_cpus - {server_cpu})
                rounds: list[list[LoopResult]] = [[], []]
                for _ in range(args.rounds):
                    for side, (url, pid) in enumerate(targets):
                        rounds[side].append(closed_loop(url, pid, load))
                baseline, loaded = merged(rounds[0]), merged(rounds[1])
            else:
                baseline, loaded = closed_loops(targets, load)
        finally:
            os.sched_setaffinity(0, own_cpus)
            canned.stop()
    finally:
        gateway.stop()
    _check(baseline, f"baseline at {wait_ms} ms")
    _check(loaded, f"gateway at {wait_ms} ms")
    return Added(wait_ms, clients, isolated, baseline, loaded)


def _versions(python: str) -> str:
    code = (
        "import importlib.metadata as m, platform; "
        "packages = ('gpt-oss', 'openai-harmony', 'fastapi', 'uvicorn'); "
        "print(platform.python_version(), *(m.version(p) for p in packages), "
        "'uvloop' if __import__('importlib.util').util.find_spec('uvloop') else 'asyncio')"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return f"Python {out[0]}, gpt-oss {out[1]}, openai-harmony {out[2]}, FastAPI {out[3]}, uvicorn {out[4]} on {out[5]}"


def report(figures: dict, args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    ref: Measured = figures["reference"]
    ours: Measured = figures["gateway"]
    stream_tokens = figures["stream_tokens"]

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:,.1f} ms"

    rows = []
    for name, m in (("reference (gpt-oss)", ref), ("gpt-oss-gateway", ours)):
        short, stream = m.short, m.stream
        rows.append(
            f"| {name} | {short.request_rate:,.0f} | {short.requests_per_cpu_s:,.0f} | {ms(short.percentile(0.5))} "
            f"| {ms(short.percentile(0.99))} | {stream.request_rate:,.1f} "
            f"| {ms(stream.percentile(0.5, stream.first_event_s))} "
            f"| {stream.delta_rate:,.0f} | {stream.deltas_per_cpu_s:,.0f} |"
        )
    ratios = (
        ours.short.request_rate / ref.short.request_rate,
        ours.short.requests_per_cpu_s / ref.short.requests_per_cpu_s,
        ours.stream.delta_rate / ref.stream.delta_rate,
        ours.stream.deltas_per_cpu_s / ref.stream.deltas_per_cpu_s,
    )
    streams = ours.stream.request_rate / ref.stream.request_rate
    first = ours.stream.percentile(0.5, ours.stream.first_event_s)
    first /= ref.stream.percentile(0.5, ref.stream.first_event_s)
    ratio = (
        f"| ratio (gateway / reference) | {ratios[0]:.1f}x | {ratios[1]:.1f}x | | | {streams:.1f}x "
        f"| {first:.2f}x | {ratios[2]:.1f}x | {ratios[3]:.1f}x |"
    )
    added_rows = []
    for a in figures["added"]:
        b, g = a.baseline, a.gateway
        added_rows.append(
            f"| {'own core each' if a.isolated else 'shared'} | {a.clients} | {a.wait_ms} ms | {g.request_rate:,.0f} "
            f"| {ms(b.percentile(0.5))} / {ms(b.percentile(0.99))} | "
            f"{ms(g.percentile(0.5))} / {ms(g.percentile(0.99))} | {ms(g.percentile(0.5) - b.percentile(0.5))} | "
            f"{ms(g.percentile(0.99) - b.percentile(0.99))} | {g.server_cpu_s / g.wall_s:.0%} |"
        )

    return "\n".join(
        [
            start,
            "## Gateway against the reference Responses server (`bench/gateway_bench.py`)",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs. Gateway: Python {platform.python_version()}, "
            f"aiohttp on {figures['gateway_loop']}, in-memory store, one process. "
            f"Reference: {_versions(args.reference_python)}, "
            "in-memory store, one process, its per-request prompt print sent to /dev/null. Both answer from an "
            "instant backend emitting the same Harmony tokens; the client (aiohttp, this process, same machine) "
            f"runs {args.clients} closed loops on keep-alive connections, timed for {args.duration:g} s per row in "
            f"{args.rounds} rounds that alternate between the servers, each after a warm-up (1 s; streams "
            f"{STREAM_WARMUP_S:g} s, the clients' starts spread over the first {STREAM_WARMUP_S - 1:g}). Server CPU "
            "is the server process's user+system time over the timed windows.",
            "",
            f"Short request: `POST /v1/responses`, non-streaming, {figures['short_tokens']} completion tokens "
            f"(analysis and a one-line answer). Stream: `stream: true`, {stream_tokens} completion tokens "
            f"({STREAM_WORDS}-word answer, one text delta per answer token on both servers); SSE tok/s counts the "
            "answer deltas received in the window.",
            "",
            "| server | short req/s | short req per CPU s | latency p50 | latency p99 | streams/s "
            "| first SSE event p50 | SSE tok/s | SSE tok per CPU s |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            ratio,
            "",
            "Latency the gateway adds: the short request with a backend that waits "
            "before its first token (then sends the rest at once), and a bare aiohttp server that waits as "
            "long and returns the gateway's own answer bytes (`bench/canned_server.py`), loaded by the same "
            "client (one loop per client, arrivals spread over one wait) for "
            f"{args.added_duration:g} s each (a p99 from over a thousand requests at 10 clients). Added = gateway − "
            "bare at the same percentile. Placement *own core each*: "
            "the client on one CPU, both servers pinned to the other and loaded in "
            f"{args.rounds} alternating rounds, so neither shares its CPU with the client or the other server "
            "(as a replica runs in a deployment); *shared*: both loaded side by side, client and servers on "
            "the same two CPUs.",
            "",
            "| placement | clients | backend wait | req/s | bare p50 / p99 | gateway p50 / p99 | added p50 "
            "| added p99 | gateway CPU |",
            "|---|---|---|---|---|---|---|---|---|",
            *added_rows,
            "",
            "Targets (issue 23): at least 10x the reference's short requests/s and 5x its streams; added p99 "
            "latency in front of a 250 ms backend at most 5 ms at 50 clients (2 ms at 10), the gateway on a "
            "CPU of its own; the shared rows show what a busy neighbour (here the load client) on the same "
            "CPUs adds. "
            "Errors in every row: 0 (the run stops on any).",
            end,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference-python",
        default=os.environ.get("GPT_OSS_PYTHON"),
        help="a Python 3.12 with the gpt-oss package (or GPT_OSS_PYTHON)",
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds timed per row")
    parser.add_argument(
        "--added-duration", type=float, default=30.0, help="seconds timed per added-latency row (p99 needs many)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds the throughput rows are split in")
    parser.add_argument(
        "--backend-ms", type=int, nargs="+", default=[1000, 250], help="backend waits for the added-latency rows"
    )
    parser.add_argument(
        "--added-clients", type=int, nargs="+", default=[10, 50], help="client counts for the added-latency rows"
    )
    parser.add_argument("--write", type=Path, help="markdown file whose section is replaced")
    args = parser.parse_args()
    if not args.reference_python:
        parser.error("--reference-python (or GPT_OSS_PYTHON) is required")
    section = report(run(args), args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
