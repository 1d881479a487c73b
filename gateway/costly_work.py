"""Work that may take seconds of CPU (a large body's parse, a large schema's checks and rendering): run in a
worker thread, at most PER_TENANT pieces of one tenant at once and at most `total` in all, so one tenant's
costly requests queue behind each other, not in front of the others'. A tenant with MAX_WAITING pieces already
waiting gets a 429 instead of a place in the queue."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import ApiError

T = TypeVar("T")
PER_TENANT = 1
MAX_WAITING = 16  # per tenant


@dataclass(slots=True)
class _Queue:
    running: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PER_TENANT))
    holders: int = 0  # running or waiting


class CostlyWork:
    def __init__(self, total: int | None = None) -> None:
        self._total = asyncio.Semaphore(total or os.cpu_count() or 2)
        self._queues: dict[str, _Queue] = {}

    def waiting(self, tenant: str) -> int:
        queue = self._queues.get(tenant)
        return queue.holders if queue is not None else 0

    async def run(self, tenant: str, work: Callable[[], T]) -> T:
        queue = self._queues.setdefault(tenant, _Queue())
        if queue.holders >= PER_TENANT + MAX_WAITING:
            message = "Too many large requests of this key's tenant are being checked at once; retry shortly."
            raise ApiError(429, message, code="rate_limit_exceeded", kind="rate_limit_error")
        queue.holders += 1
        try:
            async with queue.running, self._total:
                return await asyncio.to_thread(work)
        finally:
            queue.holders -= 1
            if not queue.holders:
                del self._queues[tenant]
