"""A background response's stream events on their way to the shared event streams (for streaming it again
on any replica): one task appends whatever has gathered, so generation never waits on Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from state import StoreUnavailable
from state.event_streams import EventStreams

log = structlog.get_logger("gateway.responses")

RETRIES = 5
CLOSE_TIMEOUT_S = 10.0


class EventSink:
    def __init__(self, streams: EventStreams, tenant: str, response_id: str) -> None:
        self._streams = streams
        self._tenant = tenant
        self._response_id = response_id
        self._pending: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def publish(self, payload: dict[str, Any]) -> None:
        self._pending.append(payload)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def close(self) -> None:
        """Wait (bounded) until every published event is appended."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_TIMEOUT_S)
            except TimeoutError:
                self._task.cancel()
                log.warning("events_not_kept", response_id=self._response_id, reason="timeout")

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self._append(batch)
            if self._closed and not self._pending:
                return

    async def _append(self, batch: list[dict[str, Any]]) -> None:
        for attempt in range(RETRIES):
            try:
                await self._streams.append(self._tenant, self._response_id, batch)
                return
            except StoreUnavailable as exc:
                if attempt == RETRIES - 1:
                    log.warning("events_not_kept", response_id=self._response_id, reason=exc.reason)
                    return
                await asyncio.sleep(0.2 * 2**attempt)
