"""Stopping background tasks for good: a cancel can be lost, so it is sent again until the task ends.

On Python 3.11, `asyncio.wait_for` returns the inner call's result when that call finishes in the same turn of the
loop as the cancel arrives, and the cancel is gone; redis-py sends every command through `wait_for` (its socket
timeout), so a task cancelled in the middle of a Redis call can carry on as if nothing happened. A shutdown that
cancelled once and waited would then wait forever, with the task still taking work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger("gateway.process.task_stop")

RECANCEL_EVERY_S = 0.5  # a cancelled task's own cleanup (a last Redis write) gets this long before the next
STOP_TIMEOUT_S = 10.0


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], what: str, timeout_s: float = STOP_TIMEOUT_S
) -> set[asyncio.Future[Any]]:
    """Cancel `tasks` and wait until they end, cancelling again every RECANCEL_EVERY_S those still running; after
    `timeout_s` the ones left are logged under `what` and returned (a shutdown goes on without them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    every = set(tasks)
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            log.warning("tasks_not_stopped", what=what, count=len(pending))
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left))
    for task in every - pending:
        if not task.cancelled():
            task.exception()  # taken, as gather's return_exceptions would: no "never retrieved" warning at exit
    return pending
