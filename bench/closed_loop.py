"""A closed-loop HTTP load client: N clients each send a request, read the whole answer, and send the next,
for a fixed time. Used by bench/gateway_bench.py against the gateway and the reference server alike."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

DELTA = b'"type":"response.output_text.delta"'  # in the event's data: LiteLLM sends no `event:` lines
COMPLETED = b'"type":"response.completed"'


@dataclass
class LoopResult:
    latencies_s: list[float] = field(default_factory=list)  # of the requests completed in the window
    first_event_s: list[float] = field(default_factory=list)  # streams: request sent → first bytes, in the window
    deltas: int = 0  # answer text deltas (one per token) received in the window
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_s)

    @property
    def request_rate(self) -> float:
        return self.requests / self.wall_s

    @property
    def delta_rate(self) -> float:
        return self.deltas / self.wall_s

    @property
    def requests_per_cpu_s(self) -> float:
        return self.requests / max(self.server_cpu_s, 1e-9)

    @property
    def deltas_per_cpu_s(self) -> float:
        return self.deltas / max(self.server_cpu_s, 1e-9)

    def percentile(self, q: float, values: list[float] | None = None) -> float:
        ordered = sorted(self.latencies_s if values is None else values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_rate(pid: int, window_s: float = 2.4) -> float:
    """CPU seconds a second the process spends unloaded (its own timers: the gateway's loop-lag watcher wakes
    every 10 ms), measured over `window_s`."""
    before = cpu_seconds(pid)
    time.sleep(window_s)
    return (cpu_seconds(pid) - before) / window_s


def wait_idle(pid: int, timeout_s: float = 15.0, idle_s_per_s: float = 0.0) -> None:
    """Until the process is idle: in a 1.2 s window (longer than an OTLP exporter's batch delay of 1 s), under
    10 ms of CPU beyond what it spends unloaded (`idle_s_per_s`, from idle_rate, with half as much again for
    noise); at most `timeout_s`: work it still does after a round would otherwise take the next one's CPU."""
    window_s = 1.2
    allowed = 0.01 + 1.5 * idle_s_per_s * window_s
    deadline = time.monotonic() + timeout_s
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = cpu_seconds(pid)
        if now - before < allowed:
            return
        before = now


def pin_threads(pid: int, cpu: int) -> None:
    """Every thread of the process (its exporters' and pools' too) on `cpu`."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(thread), {cpu})


def _count(marker: bytes, tail: bytes, chunk: bytes) -> tuple[int, bytes]:
    """Occurrences of `marker` in tail+chunk that end inside chunk, and the new tail."""
    window = tail + chunk
    return window.count(marker), window[-(len(marker) - 1) :]


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, window: tuple[float, float], result: LoopResult
) -> str | None:
    """One request read to its end, its text deltas that arrive inside `window` counted; or what went wrong."""
    sent = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            if response.status != 200:
                return f"HTTP {response.status}: {(await response.text())[:200]}"
            if not stream:
                text = await response.read()
                return None if b'"completed"' in text else f"not completed: {text[:200]!r}"
            completed = 0
            tail = done_tail = b""
            first = True
            async for chunk in response.content.iter_any():
                if first:
                    first = False
                    now = time.perf_counter()
                    if window[0] <= now < window[1]:
                        result.first_event_s.append(now - sent)
                found, tail = _count(DELTA, tail, chunk)
                ended, done_tail = _count(COMPLETED, done_tail, chunk)
                if window[0] <= time.perf_counter() < window[1]:
                    result.deltas += found
                completed += ended
            return None if completed else "stream ended before response.completed"
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Load:
    """What every loop of a run does: the request, how many clients, and the timing of the window."""

    body: bytes
    clients: int
    duration_s: float
    warmup_s: float = 1.0
    stagger_s: float = 0.0  # client i starts i * stagger_s / clients late, so loops do not move in lockstep
    stream: bool = False


async def _run(session: aiohttp.ClientSession, url: str, pid: int, load: Load) -> LoopResult:
    result = LoopResult(wall_s=load.duration_s)
    began = time.perf_counter()
    measure_from, until = began + load.warmup_s, began + load.warmup_s + load.duration_s

    async def client(index: int) -> None:
        await asyncio.sleep(index * load.stagger_s / load.clients)
        while (sent := time.perf_counter()) < until:
            error = await _one(session, url, load.body, load.stream, (measure_from, until), result)
            done = time.perf_counter()
            if error is not None:
                result.errors.append(error)
            elif measure_from <= done < until:
                result.latencies_s.append(done - sent)

    async def server_cpu() -> None:
        await asyncio.sleep(load.warmup_s)
        before = cpu_seconds(pid)
        await asyncio.sleep(load.duration_s)
        result.server_cpu_s = cpu_seconds(pid) - before

    await asyncio.gather(server_cpu(), *(client(i) for i in range(load.clients)))
    return result


async def _side_by_side(targets: list[tuple[str, int]], load: Load) -> list[LoopResult]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        return list(await asyncio.gather(*(_run(session, url, pid, load) for url, pid in targets)))


def closed_loops(targets: list[tuple[str, int]], load: Load) -> list[LoopResult]:
    """`load.clients` closed loops posting `load.body` to each (url, server pid) target, all at the same time;
    per target, the requests that complete and the text deltas that arrive in the `duration_s` after the
    warm-up are counted, and the server's CPU time over that window taken."""
    return asyncio.run(_side_by_side(targets, load))


def closed_loop(url: str, pid: int, load: Load) -> LoopResult:
    """The same against one target."""
    return closed_loops([(url, pid)], load)[0]
