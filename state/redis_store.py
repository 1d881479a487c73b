"""The shared store for many replicas: Redis standalone, Sentinel or Cluster (redis.asyncio).

URLs: `redis://` / `rediss://` / `unix://` (standalone), `redis+sentinel://[:pw@]h1:p1,h2:p2/service[/db]`,
`redis+cluster://h:p` or `rediss+cluster://h:p`. Every key of one tenant shares the hash tag
`{t:<hash of tenant>}`, so multi-key operations stay in one Cluster slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster, Sentinel

from .records import StoredCot, StoredResponse, decode_cot, decode_response, encode
from .store import DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S, StoreUnavailable

_Owned = TypeVar("_Owned", StoredResponse, StoredCot)
_UNAVAILABLE = (redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.ClusterDownError, OSError)
_TIMEOUTS = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}


def tenant_tag(tenant: str) -> str:
    return "{t:" + hashlib.sha256(tenant.encode()).hexdigest()[:16] + "}"


def connect(url: str) -> Any:
    """A redis.asyncio client for the URL (see the module docstring for the schemes)."""
    parts = urlsplit(url)
    if parts.scheme in ("redis+cluster", "rediss+cluster"):
        plain = parts.scheme.split("+", 1)[0] + url[len(parts.scheme) :]
        return RedisCluster.from_url(plain, **_TIMEOUTS)
    if parts.scheme == "redis+sentinel":
        hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in parts.netloc.rsplit("@", 1)[-1].split(",")]
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError("redis+sentinel:// URLs need the service name as the path")
        password = unquote(parts.password) if parts.password else None
        db = int(path[1]) if len(path) > 1 else 0
        sentinel = Sentinel(hosts, sentinel_kwargs={**_TIMEOUTS, "password": password}, **_TIMEOUTS)
        return sentinel.master_for(path[0], password=password, db=db)
    if parts.scheme in ("redis", "rediss", "unix"):
        return Redis.from_url(url, **_TIMEOUTS)
    raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r}")


class RedisStore:
    def __init__(
        self,
        client: Any,
        ttl_s: int = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        prefix: str = "gw:",
    ) -> None:
        self._redis = client
        self._ttl_s = int(ttl_s)
        self._max_record_bytes = max_record_bytes
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisStore:
        return cls(connect(url), **kwargs)

    def _key(self, kind: str, tenant: str, ident: str) -> str:
        return f"{self._prefix}{tenant_tag(tenant)}:{kind}:{ident}"

    @asynccontextmanager
    async def _reachable(self, operation: str) -> AsyncIterator[None]:
        """Maps connection failures to StoreUnavailable."""
        try:
            yield
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"Redis unavailable during {operation}: {type(exc).__name__}") from exc

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async with self._reachable(method):
            return await getattr(self._redis, method)(*args, **kwargs)

    async def save(self, record: StoredResponse) -> None:
        blob = encode(record, self._max_record_bytes)
        await self._call("set", self._key("resp", record.tenant, record.id), blob, ex=self._ttl_s)

    async def _get_owned(self, kind: str, tenant: str, ident: str, decode: Callable[[bytes], _Owned]) -> _Owned | None:
        """The stored object, only if the tenant inside it is the caller's (defence in depth)."""
        blob = await self._call("get", self._key(kind, tenant, ident))
        found = None if blob is None else decode(blob)
        return found if found is not None and found.tenant == tenant else None

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._get_owned("resp", tenant, response_id, decode_response)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self._call("delete", self._key("resp", tenant, response_id)))

    async def index_tool_calls(self, entries: list[StoredCot]) -> None:
        if not entries:
            return
        blobs = [(self._key("cot", e.tenant, e.call_id), encode(e, self._max_record_bytes)) for e in entries]
        async with self._reachable("index_tool_calls"), self._redis.pipeline(transaction=False) as pipe:
            for key, blob in blobs:
                pipe.set(key, blob, ex=self._ttl_s)
            await pipe.execute()

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        return await self._get_owned("cot", tenant, call_id, decode_cot)

    async def ping(self) -> bool:
        try:
            return bool(await self._call("ping"))
        except StoreUnavailable:
            return False

    async def aclose(self) -> None:
        await self._redis.aclose()
