"""What every replica sent to which server (a SharedRoutes: Redis, state/route_book.py), as a remote backend uses
it: read before choosing, within SHARED_LOOKUP_S or not at all; written in the background, at most
MAX_SHARED_NOTES writes in flight (a slow record costs requests nothing: each replica still has its own)."""

from __future__ import annotations

import asyncio
import contextlib

from backends.base import SharedRoutes

SHARED_LOOKUP_S = 0.1
SHARED_NOTE_S = 2.0
MAX_SHARED_NOTES = 256


class SharedRecord:
    def __init__(self, routes: SharedRoutes, ttl_s: float) -> None:
        self._routes = routes
        self._ttl_s = ttl_s
        self._notes: set[asyncio.Task[None]] = set()

    async def holdings(self, scope: str, names: list[bytes]) -> dict[str, int]:
        """Each server's leading pages of a prompt: up to the deepest page last sent to it (a page's name is its
        whole prefix's, so that server was sent all of it); none when the record does not answer in time."""
        try:
            async with asyncio.timeout(SHARED_LOOKUP_S):
                servers = await self._routes.lookup(scope, names)
        except TimeoutError:
            return {}
        return {server: depth for depth, server in enumerate(servers, 1) if server is not None}

    def note(self, scope: str, names: list[bytes], url: str) -> None:
        """Tell the other replicas, in the background, that `url` holds these pages."""
        if not names or len(self._notes) >= MAX_SHARED_NOTES:
            return

        async def note() -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHARED_NOTE_S):
                    await self._routes.note(scope, names, url, self._ttl_s)

        task = asyncio.ensure_future(note())
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def settled(self) -> None:
        """Until the writes in flight are done."""
        await asyncio.gather(*self._notes)
