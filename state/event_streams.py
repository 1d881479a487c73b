"""The stream events of background responses, kept so that a client can stream them again from any replica
(`GET /v1/responses/{id}?stream=true&starting_after=N`): a Redis Stream per response whose entry ids are
`0-(sequence_number + 1)`, with the store's TTL and sealed like records when encryption at rest is on; or
lists in this process with the in-memory store. Tenant-scoped keys, as every stored object."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Protocol

from .redis_client import redis_errors_as_unavailable
from .redis_json_store import RedisJsonStore
from .store import DEFAULT_TTL_S

READ_BATCH = 1000  # events per read


class EventStreams(Protocol):
    async def append(self, tenant: str, response_id: str, payloads: list[dict[str, Any]]) -> None:
        """Add events (each with its `sequence_number`, in order); StoreUnavailable when they cannot be kept."""
        ...

    async def read(self, tenant: str, response_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        """Events with a sequence number above `after`, waiting up to `wait_s` for one when there is none."""
        ...

    async def delete(self, tenant: str, response_id: str) -> None: ...

    async def aclose(self) -> None: ...


class MemoryEventStreams:
    def __init__(self, ttl_s: int = DEFAULT_TTL_S, max_responses: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_responses
        self._events: OrderedDict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = OrderedDict()
        self._changed: dict[tuple[str, str], asyncio.Event] = {}

    def _live(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        entry = self._events.get(key)
        if entry is None or entry[0] < time.monotonic():
            self._events.pop(key, None)
            return []
        return entry[1]

    async def append(self, tenant: str, response_id: str, payloads: list[dict[str, Any]]) -> None:
        key = (tenant, response_id)
        events = self._live(key)
        self._events[key] = (time.monotonic() + self._ttl_s, [*events, *payloads])
        self._events.move_to_end(key)
        while len(self._events) > self._max:
            self._events.popitem(last=False)
        changed = self._changed.pop(key, None)
        if changed is not None:
            changed.set()

    async def read(self, tenant: str, response_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        key = (tenant, response_id)
        found = [event for event in self._live(key) if event["sequence_number"] > after]
        if found or wait_s <= 0:
            return found
        changed = self._changed.setdefault(key, asyncio.Event())
        try:
            await asyncio.wait_for(changed.wait(), wait_s)
        except TimeoutError:
            return []
        return [event for event in self._live(key) if event["sequence_number"] > after]

    async def delete(self, tenant: str, response_id: str) -> None:
        self._events.pop((tenant, response_id), None)

    async def aclose(self) -> None:
        return None


class RedisEventStreams(RedisJsonStore):
    def _stream(self, tenant: str, response_id: str) -> str:
        return self._key("ev", tenant, response_id)

    async def append(self, tenant: str, response_id: str, payloads: list[dict[str, Any]]) -> None:
        key = self._stream(tenant, response_id)
        async with redis_errors_as_unavailable("append events"):
            pipe = self._redis.pipeline(transaction=False)
            for payload in payloads:
                pipe.xadd(key, {"e": self._blob(payload, key)}, id=f"0-{payload['sequence_number'] + 1}")
            pipe.expire(key, self._ttl_s)
            # an id already there is a batch resent after a dropped connection: those entries are kept once
            await pipe.execute(raise_on_error=False)

    async def read(self, tenant: str, response_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        key = self._stream(tenant, response_id)
        block = int(wait_s * 1000) if wait_s > 0 else None
        async with redis_errors_as_unavailable("read events"):
            answer = await self._redis.xread({key: f"0-{after + 1}"}, count=READ_BATCH, block=block)
        return [self._value(fields[b"e"], key) for _, entries in answer or [] for _, fields in entries]

    async def delete(self, tenant: str, response_id: str) -> None:
        async with redis_errors_as_unavailable("delete events"):
            await self._redis.delete(self._stream(tenant, response_id))
