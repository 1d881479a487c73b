"""Tenants sharing one built-in engine: fair queuing and service tiers under a flood, in one run.

    python bench/fair_share_bench.py [--seconds 20] [--write docs/benchmarks.md]

Two tables. Through a gateway (`serve` with the engine in-process, API keys, as a platform team runs it; the
issue's set-up): B's time to its first token as its client sees it (streamed Chat Completions with a JSON schema: the
first delta of reasoning or answer text), alone and beside A's flood sent through the same gateway. The other
tenants' clients (A's flood, the batch's lines) run in a process of their own, as tenants do: parsing A's thousands
of chunks a second on B's client's event loop would delay B's client, not the gateway. And the engine alone, below,
without HTTP or rendering: the scheduler's own figures, to the token where a Harmony answer's first text comes (its
fourth: the header `<|channel|>analysis<|message|>` before it), as through the gateway.

One in-process engine (a random checkpoint of the real vocabulary, 201,088, at small widths; the default batch of 8)
on the CPU. Tenant A keeps 24 long prompts (1.5-3k tokens, 64 output tokens) in flight, a new one as each ends;
tenant B sends 60 short requests one after another (100-token prompts, 8 output tokens). Measured, each against its
baseline in the same run: B's time to the first token (p50, p90) alone (before and after the rest) and beside A's
flood (both `default`; B at `priority`; A at `flex`); A's tokens a second (prompt tokens at their first token, then
each output token) alone (before B's requests and after them: the host drifts) and beside B; and B beside 200 `flex`
requests sent 4 at a time (what the batch runner sends for a 200-line batch at its default), with the time those 200
took. The issue's goals: B beside the flood within 2x of alone, A within 10% of alone, priority and flex within
1.5x, B beside the batch within 1.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import openai  # noqa: E402
from engine_fixtures import loaded, make_checkpoint, tiny_config  # noqa: E402
from gateway_fixtures import KEY_SECRET, write_keys  # noqa: E402
from live_gateway import GatewayProcess  # noqa: E402
from report import cpu_line, markers, write_section  # noqa: E402

from backends.base import GenerateRequest, Sampling  # noqa: E402
from backends.engine.backend import EngineBackend, EngineOptions  # noqa: E402
from backends.engine.batcher import FIRST_TOKENS  # noqa: E402
from harmony import load_harmony_encoding  # noqa: E402

NAME = "fair_share_bench"
FLOOD = 24
B_REQUESTS = 60  # a p90 of 60 first tokens (24 left it to the two slowest)


def request(tenant: str, index: int, prompt_tokens: int, output: int, tier: str) -> GenerateRequest:
    prompt = [200006, 17360, 200008, *((index * 7919 + i) % 50_000 + 100 for i in range(prompt_tokens))]
    return GenerateRequest(prompt, output, (), f"{tenant}-{index}", sampling=Sampling(temperature=0), tenant=tenant,
                           tier=tier)  # fmt: skip


class Flood:
    """Tenant A: FLOOD long prompts in flight until stopped; its tokens counted as they come."""

    def __init__(self, engine: EngineBackend, tier: str, tenant: str = "a") -> None:
        self.engine, self.tier, self.tenant = engine, tier, tenant
        self.tokens = 0
        self.counting = False
        self._next = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        while True:
            index = self._next
            self._next += 1
            size = 1500 + (index * 379) % 1500
            first = True
            async for chunk in self.engine.generate(request(self.tenant, index, size, 64, self.tier)):
                if self.counting:
                    self.tokens += len(chunk.tokens) + (size if first else 0)
                first = False

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._one()) for _ in range(FLOOD)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def b_first_tokens(engine: EngineBackend, tier: str, offset: int) -> list[float]:
    """B's time from submitting to its FIRST_TOKENS-th token (where a Harmony answer's first text comes), in turn."""
    times = []
    for index in range(B_REQUESTS):
        started = time.perf_counter()
        tokens = 0
        async for chunk in engine.generate(request("b", offset + index, 100, 8, tier)):
            tokens += len(chunk.tokens)
            if tokens >= FIRST_TOKENS:
                times.append(time.perf_counter() - started)
                break
        await asyncio.sleep(0.2)
    return times


async def flex_batch(engine: EngineBackend, lines: int, in_flight: int) -> float:
    queue = list(range(lines))
    started = time.perf_counter()

    async def worker() -> None:
        while queue:
            index = queue.pop()
            async for _ in engine.generate(request("batch", 50_000 + index, 300, 32, "flex")):
                pass

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - started


MODEL = "gpt-oss-20b"
KEYS = {"sk-a": "a", "sk-b": "b", "sk-batch": "batch"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}w{i}" for i in range(count))


class GatewayFlood:
    """Tenant A through the gateway: FLOOD long prompts streamed at once, a new one as each ends."""

    def __init__(self, url: str, tier: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-a", max_retries=0, timeout=600)
        self.tier, self.tokens, self.counting, self._next, self.errors = tier, 0, False, 0, 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        while True:
            index = self._next
            self._next += 1
            text = words(f"a{index}x", 300 + (index * 173) % 300)  # 1.5-3k tokens (5 a word)
            try:
                stream = await self.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=64, temperature=0,
                    stream=True, stream_options={"include_usage": True}, service_tier=self.tier,
                )  # fmt: skip
                async for chunk in stream:
                    if chunk.usage is not None and self.counting:
                        self.tokens += chunk.usage.prompt_tokens + chunk.usage.completion_tokens
            except openai.APIError:
                self.errors += 1

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._one()) for _ in range(FLOOD)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()


def visible(delta: Any) -> bool:
    """Whether a Chat Completions delta carries a token the client sees: answer text, or reasoning (an extra field)."""
    return bool(delta.content or (delta.model_extra or {}).get("reasoning"))


async def b_first_text(url: str, tier: str, tag: str, key: str = "sk-b") -> list[float]:
    """B's time from sending to its first token (reasoning or answer text), for B_REQUESTS requests in turn."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
    times = []
    for index in range(B_REQUESTS):
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": words(f"{tag}{index}x", 20)}], max_tokens=16,
            temperature=0, stream=True, service_tier=tier,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}},
        )  # fmt: skip
        first = None
        async for chunk in stream:
            if first is None and any(visible(choice.delta) for choice in chunk.choices):
                first = time.perf_counter() - started
        assert first is not None, "B's answer streamed no token"
        times.append(first)
        await asyncio.sleep(0.2)
    await client.close()
    return times


async def gateway_batch(url: str, lines: int, in_flight: int) -> float:
    """`lines` flex requests of the batch tenant, `in_flight` at once (as the batch runner sends a batch's lines)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-batch", max_retries=0, timeout=600)
    queue = list(range(lines))
    started = time.perf_counter()

    async def worker() -> None:
        while queue:
            index = queue.pop()
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": words(f"batch{index}x", 60)}], max_tokens=32,
                temperature=0, service_tier="flex",
            )  # fmt: skip

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    await client.close()
    return time.perf_counter() - started


class OtherTenant:
    """Another tenant's client in a process of its own, answering this one's commands over a pipe."""

    def __init__(self, target: Any, *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=target, args=(child, *args), daemon=True)
        self._process.start()
        child.close()

    async def ask(self, command: str | None = None) -> Any:
        """Send `command` (if any) and wait for the answer."""
        if command is not None:
            self._conn.send(command)
        return await asyncio.to_thread(self._conn.recv)

    def close(self) -> None:
        self._process.join(30)
        self._conn.close()


def flood_client(conn: Any, url: str, tier: str) -> None:
    """A's flood: "count" starts counting its tokens from 0, "tokens" answers the count, "stop" ends it."""

    async def serve() -> None:
        flood = GatewayFlood(url, tier)
        flood.start()
        conn.send("started")
        while True:
            command = await asyncio.to_thread(conn.recv)
            if command == "count":
                flood.tokens, flood.counting = 0, True
                conn.send(None)
            elif command == "tokens":
                conn.send(flood.tokens)
            else:
                await flood.stop()
                conn.send(flood.errors)
                return

    asyncio.run(serve())


def batch_client(conn: Any, url: str, lines: int, in_flight: int) -> None:
    conn.send("started")
    conn.send(asyncio.run(gateway_batch(url, lines, in_flight)))


async def through_gateway(url: str, seconds: float) -> dict:
    results: dict = {}
    await b_first_text(url, "default", "warm")
    results["b_alone"] = await b_first_text(url, "default", "alone")
    flood = OtherTenant(flood_client, url, "default")
    await flood.ask()
    await asyncio.sleep(5)
    await flood.ask("count")
    await asyncio.sleep(seconds)
    results["a_alone_tps"] = await flood.ask("tokens") / seconds
    assert results["a_alone_tps"], "A's flood finished nothing"
    await flood.ask("count")
    measured = time.perf_counter()
    results["b_beside_default"] = await b_first_text(url, "default", "beside")
    results["a_beside_tps"] = await flood.ask("tokens") / (time.perf_counter() - measured)  # both default, as below
    await flood.ask("count")
    await asyncio.sleep(seconds)
    results["a_alone_tps"] = (results["a_alone_tps"] + await flood.ask("tokens") / seconds) / 2  # before and after
    results["b_priority_beside_default"] = await b_first_text(url, "priority", "prio")
    results["a_errors"] = await flood.ask("stop")
    flood.close()
    flex = OtherTenant(flood_client, url, "flex")
    await flex.ask()
    await asyncio.sleep(5)
    results["b_beside_flex"] = await b_first_text(url, "default", "flex")
    await flex.ask("stop")
    flex.close()
    batch = OtherTenant(batch_client, url, 200, 4)
    await batch.ask()
    await asyncio.sleep(2)
    results["b_beside_batch"] = await b_first_text(url, "default", "batch")
    results["batch_s"] = await batch.ask()
    batch.close()
    results["b_alone"] += await b_first_text(url, "default", "after")  # alone again: the host drifts
    return results


def serve(directory: Path, checkpoint: Path, extra: dict[str, Any]) -> GatewayProcess:
    engine = {"checkpoint": str(checkpoint), "max_positions": 4096, "cache_dir": str(directory / "graphs"), **extra}
    limits = {"default": {"service_tiers": ["priority", "default", "flex"]}}
    env = {
        "GATEWAY_BACKENDS": json.dumps({"engine": {"kind": "onnx", "options": engine, "models": [MODEL]}}),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(directory, KEYS)),
        "GATEWAY_LIMITS": json.dumps(limits),
    }
    return GatewayProcess(env, directory / "gateway.log").start(timeout_s=900)


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(seconds: float, directory: Path, extra: dict[str, Any], checkpoint: Path) -> dict:
    graphs = str(directory / "graphs")
    options = EngineOptions(checkpoint=str(checkpoint), max_positions=4096, cache_dir=graphs, **extra)
    engine = await loaded(EngineBackend(options, load_harmony_encoding()))
    results: dict = {"max_batch": options.max_batch}
    try:
        await b_first_tokens(engine, "default", 90_000)  # warm
        results["b_alone"] = await b_first_tokens(engine, "default", 0)
        flood = Flood(engine, "default")
        flood.start()
        await asyncio.sleep(3)
        flood.counting = True
        await asyncio.sleep(seconds)
        results["a_alone_tps"] = flood.tokens / seconds
        flood.tokens = 0
        measured = time.perf_counter()
        results["b_beside_default"] = await b_first_tokens(engine, "default", 1000)
        results["a_beside_tps"] = flood.tokens / (time.perf_counter() - measured)
        flood.tokens = 0
        await asyncio.sleep(seconds)
        results["a_alone_tps"] = (results["a_alone_tps"] + flood.tokens / seconds) / 2  # before B's requests and after
        results["b_priority_beside_default"] = await b_first_tokens(engine, "priority", 2000)
        await flood.stop()
        flex = Flood(engine, "flex", "a-flex")
        flex.start()
        await asyncio.sleep(3)
        results["b_beside_flex"] = await b_first_tokens(engine, "default", 3000)
        await flex.stop()
        batch = asyncio.ensure_future(flex_batch(engine, 200, 4))
        await asyncio.sleep(1)
        results["b_beside_batch"] = await b_first_tokens(engine, "default", 4000)
        results["batch_s"] = await batch
        results["b_alone"] += await b_first_tokens(engine, "default", 5000)  # alone again: the host drifts
    finally:
        await engine.aclose()
    return results


def rows_of(results: dict) -> list[str]:
    alone = results["b_alone"]
    rows = []
    for label, key, goal in (
        ("B alone", "b_alone", "baseline"),
        ("B beside A's flood (both default)", "b_beside_default", "p90 ≤ 2x"),
        ("B at priority beside A's default flood", "b_priority_beside_default", "p90 ≤ 1.5x"),
        ("B (default) beside A's flex flood", "b_beside_flex", "p90 ≤ 1.5x"),
        ("B beside 200 flex requests, 4 in flight", "b_beside_batch", "p90 ≤ 1.5x"),
    ):
        times = results[key]
        ratio = p(times, 0.9) / p(alone, 0.9)
        p50, p90 = p(times, 0.5) * 1000, p(times, 0.9) * 1000
        rows.append(f"| {label} | {p50:.0f} ms | {p90:.0f} ms | {ratio:.2f}x | {goal} |")
    return rows


def throughput(results: dict, seconds: float) -> str:
    a_ratio = results["a_beside_tps"] / results["a_alone_tps"]
    return (
        f"A's tokens a second alone: {results['a_alone_tps']:.0f}; beside B: {results['a_beside_tps']:.0f} "
        f"({a_ratio:.2f}x; goal within 10%; alone: the mean of {seconds:.0f} s before B's default requests and "
        f"{seconds:.0f} s after them; beside: over those requests; B's priority ones come after). "
        f"The 200 flex requests took {results['batch_s']:.1f} s."
    )


def render(gateway: dict, engine: dict, seconds: float, extra: dict[str, Any]) -> str:
    start, end = markers(NAME)
    options = ", ".join(f"`{name}` {value}" for name, value in extra.items()) or "the defaults"
    header = ["| B's requests | first token p50 | p90 | p90 against alone | goal |", "|---|---|---|---|---|"]
    return "\n".join([
        start,
        "## Tenants sharing one engine: fair queuing and service tiers (`bench/fair_share_bench.py`)",
        "",
        f"CPU: {cpu_line()}; the built-in engine, a random checkpoint of the real vocabulary (201,088) at small "
        f"widths, batch of {engine['max_batch']}. Tenant A keeps {FLOOD} prompts of 1.5-3k tokens in flight; tenant "
        f"B sends {B_REQUESTS} short requests one after another. Engine options: {options}. One run; ratios against B "
        f"alone in the same table ({B_REQUESTS} requests before the other tenants' and {B_REQUESTS} after them).",
        "",
        "Through a gateway (`serve`, API keys; B's first token, reasoning or answer text, as its streaming Chat "
        "Completions client sees it, a JSON-schema answer; A's flood streamed through the same gateway, its client "
        "and the batch's in a process of their own):",
        "",
        *header,
        *rows_of(gateway),
        "",
        throughput(gateway, seconds),
        "",
        f"The engine alone (in-process, no HTTP or rendering; B's {FIRST_TOKENS}th token, where a Harmony answer's "
        "first text comes, as through the gateway):",
        "",
        *header,
        *rows_of(engine),
        "",
        throughput(engine, seconds),
        end,
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--write", type=Path)
    parser.add_argument(
        "--engine-option", action="append", default=[], metavar="NAME=VALUE",
        help="an engine option for both tables (JSON value), e.g. prefill_piece_ms=5; repeatable",
    )  # fmt: skip
    args = parser.parse_args()
    extra = {name: json.loads(value) for name, value in (option.split("=", 1) for option in args.engine_option)}
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = make_checkpoint(Path(directory) / "model", tiny_config(), "original")
        gateway = serve(Path(directory), checkpoint, extra)
        try:
            through = asyncio.run(through_gateway(gateway.url, args.seconds))
        finally:
            gateway.stop()
        engine = asyncio.run(run(args.seconds, Path(directory), extra, checkpoint))
    section = render(through, engine, args.seconds, extra)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
