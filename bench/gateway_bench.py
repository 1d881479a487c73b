"""The gateway against OpenAI's reference Responses server (`gpt-oss` package) and the LiteLLM proxy, each with an
instant backend answering the same: short non-streaming requests per second and their latency, and SSE tokens
per second and per server CPU second, at the same client concurrency in the same run. Then the latency the
gateway and LiteLLM add, at that concurrency, to a backend that takes a while to answer.

    python bench/gateway_bench.py --reference-python /path/to/python3.12 [--litellm /path/to/litellm]
        [--clients 50] [--duration 10] [--backend-ms 1000 250] [--write docs/benchmarks.md]
        [--json docs/gateway_bench.json]

The reference needs Python 3.12 with `pip install gpt-oss`; it runs offline on the packaged vocabulary. LiteLLM
(`pip install 'litellm[proxy]'`, its `litellm` command) proxies the Responses API to a bare server that
answers with the gateway's own bytes (`bench/canned_server.py`), as it would to a model server; its rows are
left out without `--litellm`. Each server is one process; the load client runs in this process (closed loops on
keep-alive connections). `--json` keeps the figures for bench/plots.py.
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
from report import cpu_line, markers, write_section  # noqa: E402

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


def post_stream(url: str) -> bytes:
    """One streamed request's whole event stream."""
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url + "/v1/responses", data=request_body(True), headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


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


def start_canned(body: bytes, delay_ms: int, scratch: Path, stream_body: bytes | None = None) -> Server:
    port = free_port()
    path = scratch / f"canned-{port}.json"
    path.write_bytes(body)
    command = [sys.executable, str(ROOT / "bench" / "canned_server.py"), "--port", str(port)]
    command += ["--delay-ms", str(delay_ms), "--body", str(path)]
    if stream_body is not None:
        streamed = scratch / f"canned-{port}.sse"
        streamed.write_bytes(stream_body)
        command += ["--stream-body", str(streamed)]
    return _spawn("canned", command, {}, f"http://127.0.0.1:{port}", scratch / "canned.log")


def start_litellm(binary: str, backend: Server, scratch: Path) -> Server:
    """The LiteLLM proxy in front of `backend` (one process, no database, no key: like the others here)."""
    port = free_port()
    config = scratch / f"litellm-{port}.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {"model": f"openai/{MODEL}", "api_base": backend.url + "/v1", "api_key": "x"},
                    }
                ]
            }
        )
    )  # JSON is YAML
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline
        "LITELLM_LOG": "ERROR",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    command = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    server = _spawn("LiteLLM", command, env, f"http://127.0.0.1:{port}", scratch / f"litellm-{port}.log", 120)

    def stop() -> None:
        server_stop()
        backend.stop()

    server_stop, server.stop = server.stop, stop
    return server


def litellm_version(binary: str) -> str:
    python = Path(binary).with_name("python")
    code = "import importlib.metadata as m, platform; print(platform.python_version(), m.version('litellm'))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return f"LiteLLM {out[1]} (Python {out[0]})"


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
    if args.litellm:  # after the gateway, whose answers its backend sends back
        starters["litellm"] = lambda marked, tokens: start_litellm(
            args.litellm, start_canned(answer_bytes[SHORT], 0, scratch, answer_bytes.get(marked)), scratch
        )
    servers: dict[tuple[str, str], Server] = {}
    answer_bytes: dict[str, bytes] = {}
    try:
        for side, start in starters.items():
            servers[side, "short"] = start(SHORT, short_tokens)
            servers[side, "stream"] = start(stream_completion(), stream_tokens)
            if side == "gateway":
                answer_bytes[SHORT] = post_short(servers[side, "short"].url, 10)  # a stream request gets the
                answer_bytes[stream_completion()] = post_stream(servers[side, "stream"].url)  # marked text's
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
    litellm: LoopResult | None = None


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
    servers: list[Server] = []
    try:
        gateway = start_gateway(SHORT, scratch, first_delay_ms=wait_ms)
        servers.append(gateway)
        answer = post_short(gateway.url, 10)
        servers.insert(0, start_canned(answer, wait_ms, scratch))
        server_cpu = max(own_cpus)
        if args.litellm:  # its backend (the same bare server) stays on the client's CPUs, as a remote one would
            backend = start_canned(answer, wait_ms, scratch)
            if isolated:
                os.sched_setaffinity(backend.pid, own_cpus - {server_cpu})
            servers.append(start_litellm(args.litellm, backend, scratch))
        targets = [(server.url + "/v1/responses", server.pid) for server in servers]
        if isolated:
            for server in servers:
                os.sched_setaffinity(server.pid, {server_cpu})
            os.sched_setaffinity(0, own_cpus - {server_cpu})
            rounds: list[list[LoopResult]] = [[] for _ in servers]
            for _ in range(args.rounds):
                for side, (url, pid) in enumerate(targets):
                    rounds[side].append(closed_loop(url, pid, load))
            results = [merged(side) for side in rounds]
        else:
            results = closed_loops(targets, load)
    finally:
        os.sched_setaffinity(0, own_cpus)
        for server in servers:
            server.stop()
    for server, result in zip(servers, results, strict=True):
        _check(result, f"{server.name} at {wait_ms} ms")
    return Added(wait_ms, clients, isolated, *results)


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

    peer: Measured | None = figures.get("litellm")
    rows = []
    sides = (("reference (gpt-oss)", ref), *((("LiteLLM", peer),) if peer else ()), ("gpt-oss-gateway", ours))
    for name, m in sides:
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
    if peer:
        ratio += (
            f"\n| ratio (gateway / LiteLLM) | {ours.short.request_rate / peer.short.request_rate:.1f}x "
            f"| {ours.short.requests_per_cpu_s / peer.short.requests_per_cpu_s:.1f}x | | "
            f"| {ours.stream.request_rate / peer.stream.request_rate:.1f}x | "
            f"| {ours.stream.delta_rate / peer.stream.delta_rate:.1f}x "
            f"| {ours.stream.deltas_per_cpu_s / peer.stream.deltas_per_cpu_s:.1f}x |"
        )
    added_rows = []
    for a in figures["added"]:
        b = a.baseline
        row = (
            f"| {'own core each' if a.isolated else 'shared'} | {a.clients} | {a.wait_ms} ms "
            f"| {a.gateway.request_rate:,.0f} | {ms(b.percentile(0.5))} / {ms(b.percentile(0.99))} "
        )
        for proxy in (a.gateway, *((a.litellm,) if peer else ())):
            row += (
                f"| {ms(proxy.percentile(0.5))} / {ms(proxy.percentile(0.99))} "
                f"| {ms(proxy.percentile(0.5) - b.percentile(0.5))} "
                f"| {ms(proxy.percentile(0.99) - b.percentile(0.99))} "
                f"| {proxy.server_cpu_s / proxy.wall_s:.0%} "
            )
        added_rows.append(row + "|")
    peer_head = " | LiteLLM p50 / p99 | its added p50 | its added p99 | LiteLLM CPU" if peer else ""

    return "\n".join(
        [
            start,
            "## Gateway against the reference Responses server and LiteLLM (`bench/gateway_bench.py`)",
            "",
            f"CPU: {cpu_line()}, {os.cpu_count()} CPUs. Gateway: Python {platform.python_version()}, "
            f"aiohttp on {figures['gateway_loop']}, in-memory store, one process. "
            f"Reference: {_versions(args.reference_python)}, "
            "in-memory store, one process, its per-request prompt print sent to /dev/null. Both answer from an "
            "instant backend emitting the same Harmony tokens. "
            + (
                f"{litellm_version(args.litellm)}: its proxy, one process, no database, in front of a bare server "
                "(`bench/canned_server.py`, not counted in its CPU) that answers at once with the gateway's own "
                "bytes (JSON, or the whole event stream), as a model server would answer it. "
                if peer
                else ""
            )
            + "The client (aiohttp, this process, same machine) "
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
            "the same two CPUs."
            + (
                " LiteLLM: its proxy in front of a second bare server that waits as long (on the client's CPU: a "
                "model server elsewhere), loaded the same way beside the other two."
                if peer
                else ""
            ),
            "",
            "| placement | clients | backend wait | req/s | bare p50 / p99 | gateway p50 / p99 | added p50 "
            f"| added p99 | gateway CPU{peer_head} |",
            "|---|---|---|---|---|---|---|---|---|" + ("---|" * 4 if peer else ""),
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
    parser.add_argument("--litellm", default=os.environ.get("LITELLM_BIN"), help="LiteLLM's `litellm` command")
    parser.add_argument("--write", type=Path, help="markdown file whose section is replaced")
    parser.add_argument("--json", type=Path, help="write the headline figures here, for bench/plots.py")
    args = parser.parse_args()
    if not args.reference_python:
        parser.error("--reference-python (or GPT_OSS_PYTHON) is required")
    figures = run(args)
    section = report(figures, args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)
    if args.json:
        args.json.write_text(json.dumps(summary(figures), indent=1) + "\n")


def _measured(m: Measured) -> dict[str, float]:
    return {
        "short_req_s": m.short.request_rate,
        "short_req_per_cpu_s": m.short.requests_per_cpu_s,
        "short_p50_ms": m.short.percentile(0.5) * 1e3,
        "short_p99_ms": m.short.percentile(0.99) * 1e3,
        "sse_tok_s": m.stream.delta_rate,
        "sse_tok_per_cpu_s": m.stream.deltas_per_cpu_s,
    }


def summary(figures: dict) -> dict:
    """What bench/plots.py draws: each server's rates, and each added-latency row's added p50 and p99."""
    servers = {side: _measured(figures[side]) for side in ("reference", "litellm", "gateway") if side in figures}
    added = []
    for a in figures["added"]:
        row = {"isolated": a.isolated, "clients": a.clients, "wait_ms": a.wait_ms}
        for side, result in (("gateway", a.gateway), ("litellm", a.litellm)):
            if result is not None:
                row[f"{side}_added_p50_ms"] = (result.percentile(0.5) - a.baseline.percentile(0.5)) * 1e3
                row[f"{side}_added_p99_ms"] = (result.percentile(0.99) - a.baseline.percentile(0.99)) * 1e3
        added.append(row)
    return {"cpu": cpu_line(), "servers": servers, "added": added}


if __name__ == "__main__":
    main()
