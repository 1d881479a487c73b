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
    """Write frames as they come; a comment line whenever `keepalive_s` pass without one."""
    iterator = aiter(frames)
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                await _write(response, KEEPALIVE)
                continue
            try:
                data = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            await _write(response, data)
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()  # the producer's own cleanup (e.g. cancelling generations) runs now, not at GC
