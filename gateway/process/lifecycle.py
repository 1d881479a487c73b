"""Graceful drain: on SIGTERM readiness fails and new API requests are refused, work in flight gets a budget,
then the generations still running are cut (their answers end as failed, with an error event), then the
process exits. Nothing is dropped mid-byte: every stream ends with a well-formed event."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog
from aiohttp import web

from ..intake.http_guard import GuardedAppRunner
from .event_loop import loop_name

log = structlog.get_logger("gateway.process.lifecycle")

SHUTTING_DOWN = "server_shutting_down"  # the error code of refused requests and of cut answers
CUT_MESSAGE = "The gateway is shutting down and ended this answer before it was complete; retry the request."
AFTER_CUT_S = 5.0  # after the cut, how long handlers get to write their final events


class Cuttable(Protocol):
    def cut(self) -> None: ...


class Lifecycle:
    """Whether the gateway is draining, the work in flight, and the generations to cut when the budget ends."""

    def __init__(self) -> None:
        self.draining = False
        self.cutting = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._hurry = asyncio.Event()
        self._generations: set[Cuttable] = set()
        self.drain_started = asyncio.Event()  # long-lived connections (WebSockets) close when it is set

    def enter(self) -> None:
        """A request or background run is in flight until its `leave()`."""
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def generation_started(self, generation: Cuttable) -> None:
        self._generations.add(generation)
        if self.cutting:
            generation.cut()

    def generation_ended(self, generation: Cuttable) -> None:
        self._generations.discard(generation)

    def hurry(self) -> None:
        """A second signal: cut what runs now instead of waiting out the budget."""
        self._hurry.set()

    async def drain(self, budget_s: float) -> None:
        """Refuse new work, wait for the work in flight up to `budget_s`, then cut what still runs."""
        self.draining = True
        self.drain_started.set()
        log.info("drain_started", in_flight=self._in_flight, budget_s=budget_s)
        await _first(self._idle.wait(), self._hurry.wait(), timeout_s=budget_s)
        if self._in_flight:
            log.warning("drain_budget_spent", in_flight=self._in_flight, generations=len(self._generations))
            self.cutting = True
            for generation in list(self._generations):
                generation.cut()
            await _first(self._idle.wait(), timeout_s=AFTER_CUT_S)
        log.info("drain_finished", cut=self.cutting, in_flight=self._in_flight)


async def _first(*waits: Awaitable[object], timeout_s: float) -> None:
    """Wait for the first of `waits` to finish, at most `timeout_s`."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    _, pending = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything heavy starts: a busy port is a one-line error, not a
    crash of a half-loaded engine."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


@dataclass(frozen=True, slots=True)
class Listening:
    """How the gateway listens: the bound socket, its URL and the connection time limits."""

    sock: socket.socket
    url: str
    header_timeout_s: float
    idle_timeout_s: float


async def _announce_ready(ready: Callable[[], Awaitable[bool]], announce: Callable[[str], None], line: str) -> None:
    while not await ready():
        await asyncio.sleep(0.2)
    announce(line)


async def serve(
    app: web.Application,
    listening: Listening,
    drain_s: float,
    lifecycle: Lifecycle,
    announce: Callable[[str], None],
    ready: Callable[[], Awaitable[bool]],
    handler_cancellation: bool = False,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain and shut down; a second signal cuts the drain short.
    `handler_cancellation`: a client that disconnects cancels its handler (the engine server's generations)."""
    runner = GuardedAppRunner(
        app,
        access_log=None,
        handler_cancellation=handler_cancellation,
        handle_signals=False,
        shutdown_timeout=AFTER_CUT_S,
        keepalive_timeout=listening.idle_timeout_s,
        header_timeout_s=listening.header_timeout_s,
    )
    await runner.setup()
    await web.SockSite(runner, listening.sock).start()
    loop = asyncio.get_running_loop()
    announce(
        f"gpt-oss-gateway listening on {listening.url} (event loop: {loop_name(loop)});"
        " it reports ready once its models have loaded"
    )
    ready_line = f"gpt-oss-gateway ready on {listening.url} (SIGTERM drains for up to {drain_s:g} s)"
    announcer = asyncio.ensure_future(_announce_ready(ready, announce, ready_line))
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            lifecycle.hurry()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        await stop.wait()
        await lifecycle.drain(drain_s)
    finally:
        announcer.cancel()
        await runner.cleanup()
