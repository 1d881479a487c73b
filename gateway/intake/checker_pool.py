"""Large request bodies checked in processes of their own before the gateway spends its own time on them.

A checker process inflates and parses a body and runs the API's checks on it (the request model, every schema,
the prompt's length where the body alone decides it) at nice 10 under SCHED_BATCH, within an address-space
bound. Whatever it refuses costs the gateway's interpreter nothing but the error; what it accepts comes back
parsed, as marshal bytes (a few ms a MiB to load, against tens for JSON). Nothing a checker does shares the event
loop's interpreter lock, and beside the gateway's busy threads it gets about a tenth of a CPU (never none):
another tenant's ordinary requests go first.

A checker that dies, runs out of time or cannot be started is replaced; the request it held is then decoded in
the gateway's paced worker threads as before (CostlyWork.run), so no request fails for a checker's sake.
"""

from __future__ import annotations

import contextlib
import importlib
import marshal
import multiprocessing
import os
import queue
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import structlog

from harmony import load_harmony_encoding
from harmony.render import Renderer

from ..errors import ApiError

log = structlog.get_logger("gateway.intake.checker_pool")
CHECKER_NICE = 10
MAX_CHECKERS = 4  # processes at most (each holds its own tokenizer)
WARM_WAIT_S = 5.0  # a call waits this long at most for the checker being started ahead
CHECK_TIMEOUT_S = 60.0  # at the lowest priority a check waits for spare CPU: generous, then the threads take over
BASE_MEMORY_BYTES = 2 * 1024**3  # a checker's address space before the body: interpreter, tokenizer, libraries
MEMORY_PER_BODY_BYTE = 24  # parsed JSON takes ~10-15x its text as Python objects; the rest is headroom

Check = Callable[[Any], None]  # the API's checks of a parsed body: an ApiError refuses it (picklable: a module
# function or a functools.partial of one)


@dataclass(frozen=True, slots=True)
class Accepted:
    body: Any
    size: int  # the decoded body's bytes


class CheckerLost(Exception):
    """The checker died, timed out or could not start: decode the body another way."""


_renderer: Renderer | None = None
_vocab_path: str | None = None


def checker_renderer() -> Renderer:
    """The Harmony renderer of the checker process (loaded on its first use)."""
    global _renderer
    if _renderer is None:
        _renderer = Renderer(load_harmony_encoding(_vocab_path), recipient_in_channel=True)
    return _renderer


def _lower_priority() -> None:
    """Nice 10 under SCHED_BATCH: about a tenth of a CPU beside a busy nice-0 thread, never none (SCHED_IDLE left
    a check waiting out CHECK_TIMEOUT_S on a host whose CPUs were all busy, and an unprivileged process cannot be
    raised from it again; at nice 19 a 0.4 s check took 32 s there)."""
    os.nice(CHECKER_NICE - os.nice(0))
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _load_checks(modules: tuple[str, ...]) -> None:
    """What every job loads first (the modules of the APIs' checks, which its pickled check names): done before
    the first job, so a checker started ahead (CheckerPool.warm) answers it at once. The tokenizer stays lazy:
    only the checks of a prompt's length load it."""
    for module in modules:
        importlib.import_module(module)


def _serve(conn: Connection, vocab_path: str | None, memory_bytes: int, preload: tuple[str, ...]) -> None:
    """A checker process: one job at a time, until the gateway closes its end."""
    global _vocab_path
    _vocab_path = vocab_path
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from .body_decoding import decode_body  # here: the gateway's modules load once the process runs

    _load_checks(preload)  # at the gateway's priority: a busy host must not hold a checker's start back for long
    _lower_priority()
    conn.send(("ready",))

    while True:
        try:
            raw, encoding, limit, check = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_answer(decode_body, raw, encoding, limit, check))


def _answer(
    decode: Callable[..., tuple[Any, int]], raw: bytes, encoding: str, limit: int, check: Check | None
) -> tuple:
    try:
        body, size = decode(raw, encoding, limit, stepwise=False)  # one run: nothing here shares a loop
        if check is not None:
            check(body)
        return ("accepted", marshal.dumps(body), size)
    except ApiError as exc:
        return ("refused", exc.status, exc.message, exc.param, exc.code, exc.kind)
    except MemoryError:
        message = "The request body takes more memory to check than the gateway allows a request."
        return ("refused", 413, message, None, "request_too_large", "invalid_request_error")
    except Exception as exc:  # a check's own failure: the request path decides (the checker lives on)
        return ("unchecked", type(exc).__name__)


class _Checker:
    def __init__(self, vocab_path: str | None, memory_bytes: int, preload: tuple[str, ...]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, vocab_path, memory_bytes, preload), name="request-checker", daemon=True
        )
        self.process.start()
        child.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.kill()
        self.process.join(5)


class CheckerPool:
    """Up to `size` checker processes, started when first needed, one per caller at once (more callers wait
    for one); `call` blocks: run it in a worker thread."""

    def __init__(
        self, vocab_path: str | None, max_body_bytes: int, size: int = MAX_CHECKERS, preload: tuple[str, ...] = ()
    ) -> None:
        """`preload`: the modules of the checks the callers pass, imported by each checker before its first job."""
        self._vocab_path = vocab_path
        self._preload = preload
        self._slots = threading.BoundedSemaphore(size)
        self._memory_bytes = BASE_MEMORY_BYTES + MEMORY_PER_BODY_BYTE * max_body_bytes
        self._idle: queue.SimpleQueue[_Checker] = queue.SimpleQueue()
        self._all: set[_Checker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._warmed = threading.Event()  # no checker being started ahead (the first call waits for one that is)
        self._warmed.set()

    def warm(self) -> None:
        """Start one checker now, in a thread of its own, so the first large body does not wait ~0.7 s for a
        process to start and import (a failure is left to the first call, which starts one as before)."""

        def start() -> None:
            try:
                with contextlib.suppress(CheckerLost), self._slots:
                    checker = self._start()
                    if self._closed:
                        self._drop(checker)
                    else:
                        self._idle.put(checker)
            finally:
                self._warmed.set()

        self._warmed.clear()
        threading.Thread(target=start, name="request-checker-warm", daemon=True).start()

    def _take(self) -> _Checker:
        self._warmed.wait(WARM_WAIT_S)
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return self._start()

    def _start(self) -> _Checker:
        with self._lock:  # `close` waits for a process being started: one left half-started dies with a traceback
            if self._closed:
                raise CheckerLost("start: the pool is closed")
            try:
                checker = _Checker(self._vocab_path, self._memory_bytes, self._preload)
            except OSError as exc:
                raise CheckerLost(f"start: {exc}") from exc
            self._all.add(checker)
        try:  # it has loaded what a job needs when it says so
            if not checker.conn.poll(CHECK_TIMEOUT_S) or checker.conn.recv() != ("ready",):
                raise CheckerLost("start: no word from the process")
        except (CheckerLost, EOFError, OSError) as exc:
            self._drop(checker)
            raise CheckerLost(f"start: {exc}") from exc
        return checker

    def _drop(self, checker: _Checker) -> None:
        with self._lock:
            self._all.discard(checker)
        checker.stop()

    def call(self, raw: bytes, encoding: str, limit: int, check: Check | None) -> Accepted:
        """The body checked and parsed, an ApiError refusing it, or CheckerLost."""
        with self._slots:
            return self._call(raw, encoding, limit, check)

    def _call(self, raw: bytes, encoding: str, limit: int, check: Check | None) -> Accepted:
        checker = self._take()
        try:
            checker.conn.send((raw, encoding, limit, check))
            if not checker.conn.poll(CHECK_TIMEOUT_S):
                raise CheckerLost("timeout")
            answer = checker.conn.recv()
        except CheckerLost:
            self._drop(checker)
            raise
        except (EOFError, OSError) as exc:
            self._drop(checker)
            raise CheckerLost(f"exit code {checker.process.exitcode}") from exc
        if self._closed:
            self._drop(checker)
        else:
            self._idle.put(checker)
        if answer[0] == "unchecked":
            raise CheckerLost(f"the check failed: {answer[1]}")
        if answer[0] == "refused":
            status, message, param, code, kind = answer[1:]
            raise ApiError(status, message, param=param, code=code, kind=kind)
        return Accepted(marshal.loads(answer[1]), answer[2])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            checkers, self._all = list(self._all), set()
        for checker in checkers:
            checker.stop()
