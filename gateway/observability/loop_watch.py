"""The event loop's lag, measured from inside the process: a task asks to wake every INTERVAL_S and records how
late it woke (`gateway_event_loop_lag_seconds`), so a stall anywhere (a parse, a garbage-collector pass, a
blocking call) shows on /metrics. At start-up what is loaded by then (the vocabulary above all) is frozen out of
the garbage collector's full passes, which would otherwise walk it, holding the interpreter, whenever young
objects pile up; and a worker thread running Python (costly work) must hand the interpreter lock to the loop
after 0.5 ms rather than Python's 5 ms."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys

from aiohttp import web

from .metrics import Metrics

INTERVAL_S = 0.01
SWITCH_INTERVAL_S = 0.0005  # a worker thread running Python hands the interpreter lock back this soon (5 ms)


async def _watch(metrics: Metrics) -> None:
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(INTERVAL_S)
        metrics.loop_lag.observe(max(0.0, loop.time() - started - INTERVAL_S))


def watch_the_loop(app: web.Application, metrics: Metrics) -> None:
    """On the app's start-up: freeze what is loaded, and watch the loop until clean-up."""
    task: asyncio.Task[None] | None = None

    async def start(app: web.Application) -> None:
        nonlocal task
        gc.freeze()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        task = asyncio.ensure_future(_watch(metrics))

    async def stop(app: web.Application) -> None:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
