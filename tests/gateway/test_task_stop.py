"""Background tasks stopped for good: a task that lets a cancel go by (as Python 3.11's wait_for can, inside any
Redis call) is cancelled again until it ends; one that never ends is given up after the bound and named."""

from __future__ import annotations

import asyncio
import contextlib

from structlog.testing import capture_logs

from gateway.process import task_stop
from gateway.process.task_stop import cancel_and_wait


async def _ignores_cancels(times: list[int], ended: list[str]) -> None:
    """Carries on through as many cancels as `times` holds, as a task whose cancel was lost does."""
    while times[0] > 0:
        times[0] -= 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("ended")


async def _fails() -> None:
    raise ValueError("a task that failed before the stop")


def test_a_task_that_lets_cancels_go_by_is_cancelled_until_it_ends(monkeypatch):
    monkeypatch.setattr(task_stop, "RECANCEL_EVERY_S", 0.01)

    async def scenario() -> None:
        ended: list[str] = []
        stubborn = asyncio.ensure_future(_ignores_cancels([3], ended))
        plain = asyncio.ensure_future(asyncio.sleep(3600))
        failed = asyncio.ensure_future(_fails())
        await asyncio.sleep(0)
        stopped = await cancel_and_wait([stubborn, plain, failed, asyncio.ensure_future(asyncio.sleep(0))], "test")
        assert stopped == set() and stubborn.cancelled() and plain.cancelled() and ended == ["ended"]
        assert isinstance(failed.exception(), ValueError)  # its error kept on the task, not raised here

    asyncio.run(scenario())


def test_a_task_that_never_ends_is_given_up_after_the_bound_and_logged(monkeypatch):
    monkeypatch.setattr(task_stop, "RECANCEL_EVERY_S", 0.01)

    async def scenario() -> None:
        ended: list[str] = []
        times = [10**9]
        endless = asyncio.ensure_future(_ignores_cancels(times, ended))
        await asyncio.sleep(0)
        with capture_logs() as logs:
            started = asyncio.get_running_loop().time()
            assert await cancel_and_wait([endless], "endless work", timeout_s=0.2) == {endless}
            assert 0.2 <= asyncio.get_running_loop().time() - started < 2
        assert not endless.done() and ended == []
        assert [(log["event"], log["what"], log["count"]) for log in logs] == [("tasks_not_stopped", "endless work", 1)]
        times[0] = 0  # it gives in: the next cancels end it
        assert await cancel_and_wait([endless], "endless work") == set() and ended == ["ended"]

    asyncio.run(scenario())
