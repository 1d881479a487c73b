"""Many concurrent Responses streams against a gateway, timed per token: the load test's client (used by
tests/gateway/test_load.py in a small form and by bench/load_test.py at full size)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import dataclass, field

import aiohttp

DELTA = b"event: response.output_text.delta"
TERMINAL = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")


@dataclass
class StreamTiming:
    first_token_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    deltas: int = 0
    terminal: str | None = None  # the stream's last lifecycle event: response.completed, .incomplete or .failed
    error: str | None = None
    response: dict | None = None  # the response object of that event

    @property
    def completed(self) -> bool:
        return self.terminal == "response.completed"


@dataclass
class LoadResult:
    streams: list[StreamTiming]
    wall_s: float

    @property
    def errors(self) -> list[str]:
        return [s.error or f"stream ended with {s.terminal}" for s in self.streams if not s.completed]

    def percentiles(self, values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        if not ordered:
            return {}
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": ordered[-1]}

    @property
    def ttft(self) -> dict[str, float]:
        return self.percentiles([s.first_token_s for s in self.streams if s.first_token_s is not None])

    @property
    def inter_token(self) -> dict[str, float]:
        return self.percentiles([gap for s in self.streams for gap in s.gaps_s])

    @property
    def tokens(self) -> int:
        return sum(s.deltas for s in self.streams)


async def _one_stream(session: aiohttp.ClientSession, url: str, body: bytes, start: asyncio.Event) -> StreamTiming:
    timing = StreamTiming()
    await start.wait()
    sent = time.perf_counter()
    last = None
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            if response.status != 200:
                timing.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return timing
            ending = False
            async for line in response.content:
                if ending and line.startswith(b"data: "):
                    timing.response = json.loads(line[6:])["response"]
                    ending = False
                elif line.startswith(DELTA):
                    now = time.perf_counter()
                    if last is None:
                        timing.first_token_s = now - sent
                    else:
                        timing.gaps_s.append(now - last)
                    last = now
                    timing.deltas += 1
                elif line.startswith(TERMINAL):
                    timing.terminal, ending = line[7:].strip().decode(), True
    except (TimeoutError, aiohttp.ClientError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
    return timing


async def run_load(base_url: str, streams: int, model: str, text: str = "hello", timeout_s: float = 300) -> LoadResult:
    """`streams` Responses streams opened at once; each delta's arrival time is recorded."""
    body = json.dumps({"model": model, "input": text, "stream": True}).encode()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(_one_stream(session, base_url + "/v1/responses", body, start)) for _ in range(streams)
        ]
        await asyncio.sleep(0.05)
        began = time.perf_counter()
        start.set()
        results = await asyncio.gather(*tasks)
        return LoadResult(list(results), time.perf_counter() - began)


def mock_script(tokens_text: str, delay_ms: int) -> dict:
    """A mock backend script whose every answer is a final message of `tokens_text`, one token per `delay_ms`."""
    return {"token_delay_ms": delay_ms, "rules": [{"emit": [{"final": tokens_text}]}]}


def active_streams(base_url: str) -> float:
    """The gateway's `gateway_active_streams` gauge, scraped from /metrics (served on the API port)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return float(re.search(r"^gateway_active_streams (\S+)$", text, re.M).group(1))
