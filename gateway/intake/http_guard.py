"""Connection-level bounds aiohttp does not give: a request's headers must arrive within a deadline.

aiohttp closes a connection only after its keep-alive timeout (an hour by default), and not while
header bytes trickle in: a client sending one header byte every few seconds (slowloris) holds a
connection, a task and its buffers indefinitely. Here a connection must deliver a complete request
head within `header_timeout_s` of opening, and then of the first byte of each next request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

HEADER_TIMEOUT_KWARG = "header_timeout_s"


class HeaderDeadlineHandler(RequestHandler):
    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._deadline: asyncio.TimerHandle | None = None
        self._heads_seen = 0
        self._answered = 0

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(self._header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()  # a connection that never sends a whole request head is closed too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_count > self._heads_seen:  # a request head is complete (its body may follow)
            self._heads_seen = self._request_count
            self._disarm()
        elif data and self._heads_seen == self._answered:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def log_access(self, request: Any, response: Any, time: float | None) -> None:
        """aiohttp calls this once each response is written: the connection is between requests."""
        self._answered += 1
        super().log_access(request, response, time)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class _GuardedServer(web.Server):
    def __call__(self) -> RequestHandler:
        kwargs = dict(self._kwargs)
        timeout = kwargs.pop(HEADER_TIMEOUT_KWARG)
        return HeaderDeadlineHandler(self, loop=self._loop, header_timeout_s=timeout, **kwargs)


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose connections get HeaderDeadlineHandler (pass `header_timeout_s=`)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # the same object; only its protocol factory differs
        return server
