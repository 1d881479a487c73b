"""A model server's own count of running and waiting requests, read from its Prometheus `/metrics`: what every
gateway replica sends it, where each replica alone knows only its own requests."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from .router import ServerView

# running and waiting requests, by the names each server exports them under (the built-in engine's servers use
# vLLM's); llama.cpp's with --metrics
RUNNING_SERIES = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING_SERIES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
MAX_METRICS_BYTES = 4 * 1024 * 1024


def reported_counts(text: str) -> tuple[float, float] | None:
    """Running and waiting requests (each the sum of its series' samples) in a Prometheus text exposition; None
    when it has none of the series."""
    running, waiting, found = 0.0, 0.0, False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in RUNNING_SERIES or name in WAITING_SERIES:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            if value != value or value < 0 or value == float("inf"):
                continue  # NaN or nonsense: not a count
            if name in RUNNING_SERIES:
                running += value
            else:
                waiting += value
            found = True
    return (running, waiting) if found else None


async def poll(session: aiohttp.ClientSession, url: str, view: ServerView, interval_s: float) -> None:
    """Keep `view`'s reported load fresh until cancelled (a server without the series is left to local counts)."""
    while True:
        try:
            async with asyncio.timeout(max(interval_s, 1.0)):
                async with session.get(url + "/metrics") as response:
                    if response.status == 200:
                        text = (await response.content.read(MAX_METRICS_BYTES)).decode("utf-8", "replace")
                        load = reported_counts(text)
                        if load is not None:
                            view.reported, view.reported_at = load, time.monotonic()
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(interval_s)
