"""Server-sent events: one writer per HTTP response, with keep-alive comments while the model is silent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .services import SERVICES

KEEPALIVE = b": keep-alive\n\n"
STREAM_OPENED = web.RequestKey("stream_opened", bool)  # set when a request's SSE stream opens (for the gauge)
DONE = b"data: [DONE]\n\n"  # the end of a Chat Completions stream


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
    request.app[SERVICES].metrics.active_streams.inc()
    return response


async def _write(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
    except (ConnectionError, RuntimeError) as exc:  # aiohttp raises both for a closed transport
        raise ClientGone from exc


def frame(payload: dict[str, Any], event: str | None = None) -> bytes:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


async def pump(response: web.StreamResponse, frames: AsyncIterator[bytes], keepalive_s: float) -> None:
    """Write frames as they come; a comment line whenever `keepalive_s` pass without one.

    Frames are awaited directly (nothing per frame but the write); a side task writes the comments, and
    when such a write finds the client gone it interrupts the wait for the next frame with ClientGone.
    """
    loop = asyncio.get_running_loop()
    writer = asyncio.current_task()
    assert writer is not None
    last_write = loop.time()
    client_gone = False

    async def keep_alive() -> None:
        nonlocal last_write, client_gone
        while True:
            await asyncio.sleep(max(0.0, last_write + keepalive_s - loop.time()))
            if loop.time() - last_write < keepalive_s:
                continue
            last_write = loop.time()
            try:
                await _write(response, KEEPALIVE)
            except ClientGone:
                client_gone = True
                writer.cancel()
                return

    ticker = asyncio.create_task(keep_alive())
    iterator = aiter(frames)
    try:
        async for data in iterator:
            last_write = loop.time()
            await _write(response, data)
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
