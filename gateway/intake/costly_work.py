"""Work that may take seconds of CPU (a large body's parse, a large schema's checks and rendering): run in a
worker thread, at most PER_TENANT pieces of one tenant at once and at most `total` in all, so one tenant's
costly requests queue behind each other, not in front of the others'. A tenant with MAX_WAITING pieces already
waiting gets a 429 instead of a place in the queue.

The worker and the event loop share one interpreter lock, and the loop serves everyone: costly work gives way
to it (pacing.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from ..errors import ApiError
from .checker_pool import Accepted, Check, CheckerLost, CheckerPool
from .pacing import paced

log = structlog.get_logger("gateway.intake.costly_work")
T = TypeVar("T")
PER_TENANT = 1
MAX_WAITING = 16  # per tenant


@dataclass(slots=True)
class _Queue:
    running: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PER_TENANT))
    holders: int = 0  # running or waiting


class CostlyWork:
    def __init__(self, total: int | None = None, checkers: CheckerPool | None = None) -> None:
        workers = total or os.cpu_count() or 2
        self._total = asyncio.Semaphore(workers)
        self._queues: dict[str, _Queue] = {}
        self._threads = ThreadPoolExecutor(workers, "costly-work")  # apart from the loop's default executor
        self.checkers = checkers

    def close(self) -> None:
        """Let the worker threads go once what runs is done (the replica is shutting down)."""
        self._threads.shutdown(wait=False)
        if self.checkers is not None:
            self.checkers.close()

    def waiting(self, tenant: str) -> int:
        queue = self._queues.get(tenant)
        return queue.holders if queue is not None else 0

    async def run(self, tenant: str, work: Callable[[], T]) -> T:
        """`work` in a worker thread, paced, in the tenant's turn."""
        return await self._in_turn(tenant, paced, asyncio.get_running_loop(), work)

    async def check(self, tenant: str, raw: bytes, encoding: str, limit: int, check: Check | None) -> Accepted | None:
        """A body decoded and checked by a checker process, in the tenant's turn: parsed, or an ApiError that
        refuses it, or None where no checker could answer (decode it with `run`)."""
        checkers = self.checkers
        if checkers is None:
            return None
        try:
            return await self._in_turn(tenant, checkers.call, raw, encoding, limit, check)
        except CheckerLost as exc:
            log.warning("request_checker_lost", reason=str(exc))
            return None

    async def _in_turn(self, tenant: str, function: Callable[..., T], *args: Any) -> T:
        """function(*args) in a worker thread, once the tenant's place and a worker are free."""
        queue = self._queues.setdefault(tenant, _Queue())
        if queue.holders >= PER_TENANT + MAX_WAITING:
            message = "Too many large requests of this key's tenant are being checked at once; retry shortly."
            raise ApiError(429, message, code="rate_limit_exceeded", kind="rate_limit_error")
        queue.holders += 1
        try:
            async with queue.running, self._total:
                return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)
        finally:
            queue.holders -= 1
            if not queue.holders:
                del self._queues[tenant]
