"""Costly work giving way to the event loop: the worker and the loop share one interpreter lock, and the loop
serves everyone. Costly work's loops call `pace()`; once per SLICE_S of work that hands the loop a turn (a
callback queued behind what the loop has ready) and waits until it ran, so the loop's ready work always goes
first. While paced work runs, the garbage collector makes no full pass on its own: such a pass walks every
object the work built (a parsed body: hundreds of thousands, acyclic JSON that reference counting frees anyway)
in one run that holds the lock; young generations are still collected."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
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


def paced(loop: asyncio.AbstractEventLoop, work: Callable[[], T]) -> T:
    """`work()` in this thread, giving `loop` its turns as it calls pace()."""
    _local.pacer = _Pacer(loop)
    try:
        with _no_full_collection():
            return work()
    finally:
        _local.pacer = None
