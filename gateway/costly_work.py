"""Work that may take seconds of CPU (a large body's parse, a large schema's checks and rendering): run in a
worker thread, at most PER_TENANT pieces of one tenant at once and at most `total` in all, so one tenant's
costly requests queue behind each other, not in front of the others'. A tenant with MAX_WAITING pieces already
waiting gets a 429 instead of a place in the queue.

The worker and the event loop share one interpreter lock, and the loop serves everyone: costly work gives way
to it. Its loops call `pace()`; once per SLICE_S of work that hands the loop a turn (a callback queued behind
what the loop has ready) and waits until it ran, so the loop's ready work always goes first. While costly work
runs, the garbage collector makes no full pass on its own: such a pass walks every object the work built (a
parsed body: hundreds of thousands, acyclic JSON that reference counting frees anyway) in one run that holds
the lock; young generations are still collected."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from .checker_pool import Accepted, Check, CheckerLost, CheckerPool
from .errors import ApiError

log = structlog.get_logger("gateway.costly_work")
T = TypeVar("T")
PER_TENANT = 1
MAX_WAITING = 16  # per tenant
SLICE_S = 0.002  # of costly work between the loop's turns
TURN_WAIT_S = 0.05  # the longest a slice waits for its turn (a loop busy past that is stalled anyway)
CHECK_EVERY = 64  # calls of pace() between looks at the clock


class _Pacer:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._turn = threading.Event()
        self._calls = 0
        self._since = time.perf_counter()

    def step(self) -> None:
        self._calls += 1
        if self._calls % CHECK_EVERY or time.perf_counter() - self._since < SLICE_S:
            return
        self._turn.clear()
        self._loop.call_soon_threadsafe(self._turn.set)  # behind what the loop has ready
        self._turn.wait(TURN_WAIT_S)
        self._since = time.perf_counter()


_local = threading.local()
_collector_lock = threading.Lock()
_holding = 0  # costly pieces running: while any does, no automatic full collection
_thresholds = gc.get_threshold()
NO_FULL_PASS = 1 << 30  # a third threshold the collector never reaches


@contextlib.contextmanager
def _no_full_collection() -> Iterator[None]:
    global _holding, _thresholds
    with _collector_lock:
        if not _holding:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], NO_FULL_PASS)
        _holding += 1
    try:
        yield
    finally:
        with _collector_lock:
            _holding -= 1
            if not _holding:
                gc.set_threshold(*_thresholds)


def pace() -> None:
    """In costly work's loops: give the event loop its turn once per slice (nothing outside costly work)."""
    pacer = getattr(_local, "pacer", None)
    if pacer is not None:
        pacer.step()


def _paced(loop: asyncio.AbstractEventLoop, work: Callable[[], T]) -> T:
    _local.pacer = _Pacer(loop)
    try:
        with _no_full_collection():
            return work()
    finally:
        _local.pacer = None


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
        return await self._in_turn(tenant, _paced, asyncio.get_running_loop(), work)

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
