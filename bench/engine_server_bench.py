"""The built-in engine as a model server against the same engine in-process, through the gateway's Responses API.

    python bench/engine_server_bench.py [--layers 2] [--rounds 3] [--tokens 64] [--write docs/benchmarks.md]

One random checkpoint of gpt-oss-20b's width (hidden 2880, vocabulary 201,088, 32 experts, 4 a token) and few
layers, on the CPU. Two set-ups run side by side and are measured in alternated rounds: a gateway with the engine
in-process, and an API replica (`GATEWAY_BACKEND=engine`) in front of an engine server (`serve-engine`) with the
same options. Per round and concurrency (1 and 8 streams, each its own prompt, greedy, `--tokens` output tokens):
time to the first token as the gateway measures it (the random model's output is no Harmony the client could
time by its events), and output tokens a second over the round. Then, with an API replica
in front of two engine servers: a tool call forced by `tool_choice` and a JSON-schema answer through the wire
(checked against their schemas), the time a client's disconnect takes to free its sequence on the engine server,
and an engine server killed while 24 requests run or wait (8 running on each server, 4 waiting): the
requests not yet streaming must all finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from engine_servers import EngineServer  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402

from backends.engine.config import GPT_OSS_20B  # noqa: E402
from backends.engine.kernels.build import KERNELS_ENV, build_library  # noqa: E402
from backends.engine.make_checkpoint import write_random_checkpoint  # noqa: E402

NAME = "engine_server_bench"
MODEL = "gpt-oss-20b"
KEY = "bench-engine-key"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["answer", "unit"],
    "additionalProperties": False,
}


def prompt_text(index: int, words: int = 160) -> str:
    """A prompt of its own for each request (no prefix shared with another: prefill is measured, not reuse)."""
    return f"Request {index}. " + " ".join(f"w{index}x{i}" for i in range(words))


def first_token_totals(url: str) -> tuple[float, float]:
    """The gateway's `gateway_time_to_first_token_seconds` (admission to the first generated token): sum, count."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"gateway_time_to_first_token_seconds_{part}{{") and f'model="{MODEL}"' in line:
                found[part] = float(line.rsplit(" ", 1)[1])
    return found.get("sum", 0.0), found.get("count", 0.0)


@dataclass
class Round:
    first_token_s: float = 0.0  # the mean over the round's requests, as the gateway measured it
    output_tokens: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    wall_s: float = 0.0


async def _one(client: openai.AsyncOpenAI, index: int, tokens: int, result: Round) -> None:
    stream = await client.responses.create(
        model=MODEL, input=prompt_text(index), max_output_tokens=tokens, temperature=0, stream=True
    )
    async for event in stream:
        if event.type in ("response.completed", "response.incomplete"):
            result.output_tokens += event.response.usage.output_tokens
            result.prompt_tokens.append(event.response.usage.input_tokens)


async def measure(url: str, streams: int, tokens: int, offset: int) -> Round:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    result = Round()
    before = first_token_totals(url)
    started = time.perf_counter()
    await asyncio.gather(*(_one(client, offset + i, tokens, result) for i in range(streams)))
    result.wall_s = time.perf_counter() - started
    after = first_token_totals(url)
    result.first_token_s = (after[0] - before[0]) / max(after[1] - before[1], 1)
    await client.close()
    return result


def gateway_env(backend: str, urls: list[str], options: dict) -> dict[str, str]:
    env = {"GATEWAY_MODELS": MODEL, "GATEWAY_AUTH": "off", "GATEWAY_BACKEND": backend, "GATEWAY_METRICS_PUBLIC": "1"}
    if urls:
        env["GATEWAY_BACKEND_URLS"] = ",".join(urls)
    env["GATEWAY_BACKEND_OPTIONS"] = json.dumps(options)
    return env


def checks_through_the_wire(url: str) -> dict[str, str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    call = client.responses.create(
        model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=512, temperature=0
    )
    calls = [item for item in call.output if item.type == "function_call"]
    tool = "no call"
    if calls and call.status == "completed":
        arguments = json.loads(calls[0].arguments)
        valid = set(arguments) == {"city", "days"} and isinstance(arguments["days"], int)
        tool = f"`{calls[0].name}` with arguments valid against its schema: {valid}"
    elif calls:
        tool = f"`{calls[0].name}` called, arguments cut at the token limit (status {call.status})"
    answer = client.responses.create(
        model=MODEL,
        input="How far?",
        max_output_tokens=512,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
    )
    if answer.status == "completed":
        parsed = json.loads(answer.output_text)
        schema = f"valid JSON of the schema: {set(parsed) == {'answer', 'unit'}}"
    else:
        schema = f"cut at the token limit (status {answer.status})"
    return {"tool": tool, "schema": schema}


def disconnect_frees(url: str, servers: list[EngineServer]) -> float:
    """Seconds from a streaming client's disconnect to no sequence running on any engine server."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    stream = client.responses.create(
        model=MODEL, input="a long answer", max_output_tokens=2000, temperature=0, stream=True
    )
    for event in stream:
        if event.type.endswith(".delta"):
            break
    closed = time.perf_counter()
    stream.close()
    while sum(s.metrics()["vllm:num_requests_running"] for s in servers):
        if time.perf_counter() - closed > 30:
            break
        time.sleep(0.005)
    return time.perf_counter() - closed


async def kill_mid_run(url: str, victim: EngineServer, requests: int, tokens: int) -> dict[str, int]:
    """`requests` at once; the victim killed once the first tokens arrive. Outcomes by whether the request had
    begun streaming when it failed."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    streaming = asyncio.Event()
    outcome = {"finished": 0, "failed_while_streaming": 0, "failed_before_streaming": 0}

    async def one(index: int) -> None:
        began = False
        try:
            stream = await client.responses.create(
                model=MODEL, input=prompt_text(10_000 + index, 40), max_output_tokens=tokens, temperature=0, stream=True
            )
            async with stream:
                async for event in stream:
                    if event.type.endswith(".delta"):
                        began = True
                        streaming.set()
                    if event.type in ("response.completed", "response.incomplete"):
                        outcome["finished"] += 1
                        return
                    if event.type in ("response.failed", "error"):
                        break
        except openai.APIError:
            pass
        outcome["failed_while_streaming" if began else "failed_before_streaming"] += 1

    tasks = [asyncio.create_task(one(i)) for i in range(requests)]
    await streaming.wait()
    victim.kill()
    await asyncio.gather(*tasks)
    await client.close()
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    config = replace(GPT_OSS_20B, num_hidden_layers=args.layers)
    os.environ[KERNELS_ENV] = str(build_library())
    work = Path(tempfile.mkdtemp(prefix="engine-server-bench-"))
    checkpoint = write_random_checkpoint(work / "model", config, "original", seed=3)
    options = {"checkpoint": str(checkpoint), "max_batch": 8, "max_positions": 4096, "cache_dir": str(work / "cache")}
    processes: list = []
    try:
        local = GatewayProcess(gateway_env("onnx", [], options), work / "local.log").start(timeout_s=900)
        processes.append(local)
        engine = EngineServer(options, work / "engine0.log", api_key=KEY).start(timeout_s=900)
        processes.append(engine)
        remote_options = {"api_key": KEY, "context_length": 4096}
        remote = GatewayProcess(gateway_env("engine", [engine.url], remote_options), work / "remote.log").start()
        processes.append(remote)
        for url in (local.url, remote.url):  # warm: graph sessions, kernels, first allocations
            asyncio.run(measure(url, 2, 16, 90_000))
        rows: dict[tuple[str, int], list[Round]] = {}
        offset = 0
        for round_index in range(args.rounds):
            for streams in (1, 8):
                order = [("in-process", local.url), ("engine server", remote.url)]
                for label, url in order if round_index % 2 == 0 else order[::-1]:
                    measured = asyncio.run(measure(url, streams, args.tokens, offset))
                    offset += streams
                    rows.setdefault((label, streams), []).append(measured)
                    print(label, streams, measured, flush=True)
        local.stop()
        second = EngineServer(options, work / "engine1.log", api_key=KEY).start(timeout_s=900)
        processes.append(second)
        fleet_options = {"api_key": KEY, "context_length": 4096, "probe_interval_s": 1.0}
        fleet = GatewayProcess(gateway_env("engine", [engine.url, second.url], fleet_options), work / "fleet.log")
        processes.append(fleet.start())
        wire = checks_through_the_wire(fleet.url)
        freed_s = [disconnect_frees(fleet.url, [engine, second]) for _ in range(3)]
        killed = asyncio.run(kill_mid_run(fleet.url, engine, 24, args.tokens))
    finally:
        for process in processes:
            process.stop()
        shutil.rmtree(work, ignore_errors=True)
    section = render(rows, wire, freed_s, killed, config.num_hidden_layers, args)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)
    return 0


def _ratio_row(rows: dict, streams: int) -> str:
    local, remote = rows[("in-process", streams)], rows[("engine server", streams)]

    def ttft(rounds: list[Round]) -> float:
        return statistics.median(r.first_token_s for r in rounds)

    def rate(rounds: list[Round]) -> float:
        return statistics.median(r.output_tokens / r.wall_s for r in rounds)

    return (
        f"| {streams} | {ttft(local) * 1000:.0f} ms | {ttft(remote) * 1000:.0f} ms | "
        f"**{ttft(remote) / ttft(local):.2f}x** | {rate(local):.1f} | {rate(remote):.1f} | "
        f"**{rate(remote) / rate(local):.2f}x** |"
    )


def render(rows: dict, wire: dict, freed_s: list[float], killed: dict, layers: int, args: argparse.Namespace) -> str:
    start, end = markers(NAME)
    prompt = round(statistics.mean(t for rounds in rows.values() for r in rounds for t in r.prompt_tokens))
    lines = [
        start,
        "## The engine as a model server (`bench/engine_server_bench.py`)",
        "",
        f"CPU: {cpu_line()}, {os.cpu_count()} CPUs, Python {platform.python_version()}. A random checkpoint of "
        f"gpt-oss-20b's width (hidden 2880, vocabulary 201,088, 32 experts, 4 a token) at {layers} layers, float32 "
        f"on the CPU, `max_batch` 8. The same engine in-process against an API replica in front of an engine server "
        f"(`serve-engine`), {args.rounds} alternated rounds, medians; each request its own {prompt}-token prompt, "
        f"greedy, {args.tokens} output tokens. Time to first token: the gateway's "
        "`gateway_time_to_first_token_seconds` (admission to the first generated token; a round's mean).",
        "",
        "| streams | first token, in-process | through the engine server | ratio | tok/s, in-process "
        "| through the engine server | ratio |",
        "|---|---|---|---|---|---|---|",
        _ratio_row(rows, 1),
        _ratio_row(rows, 8),
        "",
        "With an API replica in front of two engine servers:",
        "",
        f"- a tool call forced by `tool_choice: required`: {wire['tool']}; a `json_schema` answer: {wire['schema']};",
        f"- a streaming client that disconnects: its sequence left the engine server's batch within "
        f"{max(freed_s) * 1000:.0f} ms (3 tries: {', '.join(f'{s * 1000:.0f}' for s in freed_s)} ms);",
        f"- an engine server killed (SIGKILL) while 24 requests ran or waited: {killed['finished']} finished, "
        f"{killed['failed_while_streaming']} failed that were streaming from it, "
        f"**{killed['failed_before_streaming']} failed that had not begun streaming**.",
        end,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
