"""What every gateway replica sent to which model server, shared through Redis: routing by prefix over servers that
publish nothing (SGLang, llama.cpp, vLLM without its events) then agrees across replicas, and a replica started
later knows at once.

One Redis hash per backend and cache namespace (a tenant's), its key's hash tag the scope, so one HMGET reads all
of a prompt's pages in one Cluster slot: field = a page's name (8 bytes, hex), value = `server|expiry ms`. An entry
past its expiry counts as forgotten (the server's cache would have let it go); the whole hash expires when its
scope has been idle that long, and is dropped when it grows past `max_pages`.
"""

from __future__ import annotations

import time
from typing import Any

from .redis_client import connect, redis_errors_as_unavailable

PREFIX = "gpt-oss:routes:"


class RedisRouteBook:
    def __init__(self, client: Any, max_pages: int = 262_144) -> None:
        self._client = client
        self._max_pages = max_pages

    @classmethod
    def from_url(cls, url: str) -> RedisRouteBook:
        return cls(connect(url))

    @staticmethod
    def _key(scope: str) -> str:
        return f"{PREFIX}{{{scope}}}"

    async def lookup(self, scope: str, names: list[bytes]) -> list[str | None]:
        """The server each page was last sent to, None where none is remembered."""
        if not names:
            return []
        async with redis_errors_as_unavailable("routes"):
            values = await self._client.hmget(self._key(scope), [name[:8].hex() for name in names])
        now = time.time() * 1000
        found: list[str | None] = []
        for value in values:
            server, _, expiry = (value.decode() if isinstance(value, bytes) else value or "").rpartition("|")
            found.append(server if server and expiry.isdigit() and int(expiry) > now else None)
        return found

    async def note(self, scope: str, names: list[bytes], server: str, ttl_s: float) -> None:
        """`server` now holds these pages, for `ttl_s`."""
        if not names:
            return
        key = self._key(scope)
        value = f"{server}|{int((time.time() + ttl_s) * 1000)}"
        async with redis_errors_as_unavailable("routes"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping={name[:8].hex(): value for name in names})
                pipe.pexpire(key, int(ttl_s * 1000))
                pipe.hlen(key)
                *_, size = await pipe.execute()
            if size > self._max_pages:
                await self._client.delete(key)  # a runaway scope: start it over

    async def aclose(self) -> None:
        await self._client.aclose()
