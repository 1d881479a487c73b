"""Following an engine server's page events (`GET /v1/engine/kv_events`, see backends/engine_wire.py) into its
ServerView: a snapshot (with the requests it runs at once), then each batch in order, and its load (running and
waiting requests, and the prompt tokens they have left to run) as it changes. A stream that ends, stalls past three
heartbeats, skips a sequence number or sends what cannot be read leaves the pages out of sync (routing falls back to
what was routed there) until a new connection brings a new snapshot; a restarted server (another `instance`) starts
from its own.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import structlog

from backends.base import ServerLoad
from backends.engine_wire import EVENTS_PATH
from backends.sse_reader import sse_events

from .router import ServerView

log = structlog.get_logger("backends.routing")

STALL_S = 15.0  # three heartbeats: a stream silent this long is given up
RECONNECT_S = 1.0
MAX_EVENT_BYTES = 256 * 1024 * 1024  # a snapshot of a large cache: ~70 bytes a page


class OutOfOrder(ValueError):
    """The stream skipped events or sent something it should not."""


async def follow(session: aiohttp.ClientSession, url: str, view: ServerView) -> None:
    """Keep `view`'s published pages, slots and load in step with the server at `url` until cancelled."""
    pages = view.published
    assert pages is not None
    while True:
        try:
            async with session.get(
                url + EVENTS_PATH, timeout=aiohttp.ClientTimeout(total=None, sock_read=STALL_S)
            ) as response:
                if response.status == 200:
                    async for event in sse_events(response.content.iter_any(), MAX_EVENT_BYTES):
                        _apply(view, json.loads(event.value))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            if pages.in_sync:
                log.warning("kv_events_lost", upstream=url, reason=type(exc).__name__)
        pages.lose()
        view.pushed = None
        await asyncio.sleep(RECONNECT_S)


def _apply(view: ServerView, payload: Any) -> None:
    if not isinstance(payload, dict):
        raise OutOfOrder("an event is not an object")
    pages = view.published
    assert pages is not None
    if "pages" in payload:
        names = (bytes.fromhex(name) for name, _ in payload["pages"])
        shared = payload["prefix_cache_scope"] == "shared"
        pages.reset(payload["instance"], int(payload["page_size"]), shared, int(payload["seq"]), names)
        if "slots" in payload:
            view.slots = _count(payload["slots"]) or None
    elif payload.get("instance") != pages.instance:
        raise OutOfOrder("an event of another instance")
    elif "events" in payload:
        events = ((event[0], bytes.fromhex(event[1])) for event in payload["events"])
        if not pages.apply(int(payload["first"]), int(payload["seq"]), events):
            raise OutOfOrder("a gap in the events")
    if "running" in payload:
        filling = [_count(payload.get(name, 0)) for name in ("filling", "filling_prompts")]  # none: an earlier version
        view.pushed = ServerLoad(_count(payload["running"]), _count(payload["waiting"]), *filling)


def _count(value: Any) -> int:
    """A non-negative count from the stream."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OutOfOrder("a count that is not one")
    return value
