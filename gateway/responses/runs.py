"""Responses generating in this process: their tasks and their event logs, for streams, GETs and cancel."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..limits import MAX_STREAM_BACKLOG
from ..process.task_stop import cancel_and_wait


class ListenerTooSlow(Exception):
    """The listener left more than `max_pending` events unread: it is cut rather than buffered for."""


class EventLog:
    """The SSE payloads of one response, for its one listener: read events are dropped, so memory holds
    only the unread backlog (at most `max_pending` events), and nothing once the listener has gone."""

    def __init__(self, max_pending: int = MAX_STREAM_BACKLOG) -> None:
        self._max_pending = max_pending
        self.overflowed = False
        self._pending: deque[dict[str, Any]] = deque()
        self._attached = True
        self.finished = False
        self._waiter: asyncio.Future[None] | None = None  # the listener's, while it waits for events

    def publish(self, payload: dict[str, Any]) -> None:
        if self._attached:
            self._pending.append(payload)
            if len(self._pending) > self._max_pending:
                self.overflowed = True
                self.detach()
            self._wake()

    def close(self) -> None:
        self.finished = True
        self._wake()

    def detach(self) -> None:
        """The listener left (a background response runs on): stop keeping events."""
        self._attached = False
        self._pending.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def follow(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Everything published since the last batch, as one batch (one write for the stream)."""
        while True:
            if self._pending:
                batch = list(self._pending)
                self._pending.clear()
                yield batch
                continue
            if self.overflowed:
                raise ListenerTooSlow
            if self.finished:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


@dataclass(slots=True)
class Run:
    tenant: str
    log: EventLog = field(default_factory=EventLog)
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False


class RunRegistry:
    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def add(self, response_id: str, run: Run) -> None:
        self._runs[response_id] = run

    def get(self, tenant: str, response_id: str) -> Run | None:
        run = self._runs.get(response_id)
        return run if run is not None and run.tenant == tenant else None

    def remove(self, response_id: str) -> None:
        self._runs.pop(response_id, None)

    def cancel(self, tenant: str, response_id: str) -> bool:
        run = self.get(tenant, response_id)
        if run is None or run.task is None or run.task.done():
            return False
        run.cancel_requested = True
        run.task.cancel()
        return True

    async def shutdown(self) -> None:
        tasks = [run.task for run in self._runs.values() if run.task is not None and not run.task.done()]
        await cancel_and_wait(tasks, "background responses")
