"""Server-sent events: one writer per HTTP response, with keep-alive comments while the model is silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web

from state.fast_json import dumps

KEEPALIVE = b": keep-alive\n\n"
STREAM_OPENED = web.RequestKey("stream_opened", bool)  # set when a request's SSE stream opens (for the gauge)
DONE = b"data: [DONE]\n\n"  # the end of a Chat Completions stream


class _StreamSettings(Protocol):
    @property
    def keepalive_s(self) -> float: ...
    @property
    def write_stall_s(self) -> float: ...


class _Gauge(Protocol):
    def inc(self) -> None: ...


class _StreamMetrics(Protocol):
    @property
    def active_streams(self) -> _Gauge: ...


class StreamServices(Protocol):
    """What streaming needs of the app's services (gateway.services.Services has it)."""

    @property
    def settings(self) -> _StreamSettings: ...
    @property
    def metrics(self) -> _StreamMetrics: ...


STREAMING = web.AppKey("streaming", StreamServices)  # the app's services, as a stream sees them


class ClientGone(Exception):
    """The client closed the connection; stop generating for it."""


async def open_stream(request: web.Request, headers: dict[str, str] | None = None) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **(headers or {}),
        }
    )
    await response.prepare(request)
    request[STREAM_OPENED] = True
    request.app[STREAMING].metrics.active_streams.inc()
    return response


class Writer:
    """Writes to one stream and says how long its pending write has waited: a write waits only once the
    client leaves its socket buffers full, and `pump` aborts the connection when one waits `stall_s`, so a
    client that stops reading pins neither the generation nor its output in memory. (A watchdog, not a
    timer per write: frames are written per token.)"""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self._request = request
        self._response = response
        self._loop = asyncio.get_running_loop()
        self.pending_since: float | None = None

    async def __call__(self, data: bytes) -> None:
        self.pending_since = self._loop.time()
        try:
            await self._response.write(data)
        except (ConnectionError, RuntimeError) as exc:  # aiohttp raises both for a closed transport
            raise ClientGone from exc
        finally:
            self.pending_since = None

    def abort(self) -> None:
        """Drop the connection with what is unsent (close() would wait to flush what nobody reads)."""
        transport = self._request.transport
        if transport is not None:
            transport.abort()


def frame(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + dumps(payload) + b"\n\n"


async def pump(request: web.Request, response: web.StreamResponse, frames: AsyncIterator[bytes]) -> None:
    """Write frames as they come; a comment line whenever `keepalive_s` pass without one.

    Frames are awaited directly (nothing per frame but the write); a side task writes the comments, and
    when such a write finds the client gone it interrupts the wait for the next frame with ClientGone.
    """
    settings = request.app[STREAMING].settings
    keepalive_s, stall_s = settings.keepalive_s, settings.write_stall_s
    write = Writer(request, response)
    loop = asyncio.get_running_loop()
    writer = asyncio.current_task()
    assert writer is not None
    last_write = loop.time()
    client_gone = False

    def gone() -> None:
        nonlocal client_gone
        client_gone = True
        write.abort()
        writer.cancel()

    async def keep_alive() -> None:
        """Comments while the model is silent; and the stall watchdog (it wakes at least every stall_s / 4)."""
        nonlocal last_write
        while True:
            now = loop.time()
            pending = write.pending_since
            if pending is not None:
                if now - pending >= stall_s:
                    write.abort()  # the pending write raises, and the stream ends as ClientGone
                    return
                await asyncio.sleep(pending + stall_s - now)
                continue
            if now - last_write < keepalive_s:
                await asyncio.sleep(min(last_write + keepalive_s - now, stall_s / 4))
                continue
            last_write = now
            try:
                async with asyncio.timeout(stall_s):  # a comment every keepalive_s: a timer here is cheap
                    await write(KEEPALIVE)
            except (ClientGone, TimeoutError):
                gone()
                return

    ticker = asyncio.create_task(keep_alive())
    iterator = aiter(frames)
    try:
        async for data in iterator:
            last_write = loop.time()
            await write(data)
    except ClientGone:
        write.abort()
        raise
    except asyncio.CancelledError:
        if client_gone and writer.uncancel() == 0:
            raise ClientGone from None
        raise
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()  # the producer's own cleanup (e.g. cancelling generations) runs now, not at GC


async def end_stream(request: web.Request, response: web.StreamResponse) -> None:
    """The stream's last bytes, under the same stall limit as every frame: write_eof waits for the client to
    take what is still buffered, and one that reads nothing more is cut, so the handler always ends."""
    try:
        async with asyncio.timeout(request.app[STREAMING].settings.write_stall_s):
            await response.write_eof()
    except (TimeoutError, ConnectionError, RuntimeError):
        transport = request.transport
        if transport is not None:
            transport.abort()
