"""The event loop's lag, measured from inside the process: a task asks to wake every INTERVAL_S and records how
late it woke (`gateway_event_loop_lag_seconds`), so a stall anywhere (a parse, a garbage-collector pass, a
blocking call) shows on /metrics. At start-up what is loaded by then (the vocabulary above all) is frozen out of
the garbage collector's full passes, which would otherwise walk it, holding the interpreter, whenever young
objects pile up; and a worker thread running Python (costly work) must hand the interpreter lock to the loop
after 0.5 ms rather than Python's 5 ms.

A lag whose late time the loop's thread spent mostly waiting for a CPU (its run-queue wait in
/proc/thread-self/schedstat) is also counted in `gateway_event_loop_lag_descheduled_seconds`: a host short of
CPUs, not code that held the loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys

from aiohttp import web

from .metrics import Metrics

INTERVAL_S = 0.01
SWITCH_INTERVAL_S = 0.0005  # a worker thread running Python hands the interpreter lock back this soon (5 ms)


class _RunQueueWait:
    """The calling thread's time waiting for a CPU so far, in seconds (0 where the kernel does not say)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


async def _watch(metrics: Metrics) -> None:
    loop = asyncio.get_running_loop()
    waited = _RunQueueWait()  # opened here: the loop's own thread
    wait_before = waited()
    try:
        while True:
            started = loop.time()
            await asyncio.sleep(INTERVAL_S)
            lag = max(0.0, loop.time() - started - INTERVAL_S)
            wait_now = waited()  # one read a tick: this tick's end is the next one's start
            metrics.loop_lag.observe(lag)
            if lag and wait_now - wait_before >= lag / 2:
                metrics.loop_lag_descheduled.observe(lag)
            wait_before = wait_now
    finally:
        waited.close()


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
