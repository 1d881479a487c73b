"""Batches (the Batch API): each batch's object, its lines' results, who runs it, and a cancel request.

Any replica may run a batch: the one that claims its lease (renewed while it runs; a dead replica's lapses and
another claims it). A line's result is kept once (HSETNX by line number): a replica that picks a batch up runs
only the lines with no result, and a line's result, once kept, is never replaced. A cancel is a flag beside
the batch, so the runner's progress writes never lose it. Batches that have not ended are listed in one set
that every replica's runner reads. Objects are sealed like the store's records when encryption at rest is on.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from .redis_client import redis_errors_as_unavailable
from .redis_json_store import RedisJsonStore

TERMINAL = frozenset({"failed", "completed", "expired", "cancelled"})


class BatchStore(Protocol):
    async def save(self, tenant: str, batch: dict[str, Any]) -> None:
        """Keep the batch object (new or changed); an ended one leaves the set of batches to run."""
        ...

    async def load(self, tenant: str, batch_id: str) -> dict[str, Any] | None: ...

    async def listing(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's batches, oldest first."""
        ...

    async def unfinished(self) -> list[tuple[str, str]]:
        """(tenant, batch id) of every batch not ended, whoever runs it."""
        ...

    async def claim(self, tenant: str, batch_id: str, owner: str, lease_s: float) -> bool:
        """Take the batch's lease, or renew it when `owner` holds it; False when another does."""
        ...

    async def release(self, tenant: str, batch_id: str, owner: str) -> None: ...

    async def keep_result(self, tenant: str, batch_id: str, line: int, result: dict[str, Any]) -> bool:
        """Keep line `line`'s result unless one is kept already (then False)."""
        ...

    async def results(self, tenant: str, batch_id: str) -> dict[int, dict[str, Any]]: ...

    async def request_cancel(self, tenant: str, batch_id: str, at: int) -> int:
        """Flag the batch for cancelling; when it was flagged already, the first flag's time."""
        ...

    async def cancel_requested(self, tenant: str, batch_id: str) -> int | None: ...

    async def aclose(self) -> None: ...


class MemoryBatches:
    """This process's batches (no Redis): one replica runs them all."""

    def __init__(self, ttl_s: int) -> None:
        self._ttl_s = ttl_s
        self._batches: dict[tuple[str, str], dict[str, Any]] = {}
        self._results: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
        self._leases: dict[tuple[str, str], tuple[str, float]] = {}
        self._cancels: dict[tuple[str, str], int] = {}

    def _expire(self) -> None:
        oldest = time.time() - self._ttl_s
        for key in [k for k, b in self._batches.items() if b["created_at"] < oldest]:
            for table in (self._batches, self._results, self._leases, self._cancels):
                table.pop(key, None)

    async def save(self, tenant: str, batch: dict[str, Any]) -> None:
        self._expire()
        self._batches[(tenant, batch["id"])] = json.loads(json.dumps(batch))

    async def load(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        batch = self._batches.get((tenant, batch_id))
        return json.loads(json.dumps(batch)) if batch is not None else None

    async def listing(self, tenant: str) -> list[dict[str, Any]]:
        mine = [b for (t, _), b in self._batches.items() if t == tenant]
        return [json.loads(json.dumps(b)) for b in sorted(mine, key=lambda b: (b["created_at"], b["id"]))]

    async def unfinished(self) -> list[tuple[str, str]]:
        return [key for key, batch in self._batches.items() if batch["status"] not in TERMINAL]

    async def claim(self, tenant: str, batch_id: str, owner: str, lease_s: float) -> bool:
        held = self._leases.get((tenant, batch_id))
        now = time.monotonic()
        if held is not None and held[0] != owner and held[1] > now:
            return False
        self._leases[(tenant, batch_id)] = (owner, now + lease_s)
        return True

    async def release(self, tenant: str, batch_id: str, owner: str) -> None:
        held = self._leases.get((tenant, batch_id))
        if held is not None and held[0] == owner:
            del self._leases[(tenant, batch_id)]

    async def keep_result(self, tenant: str, batch_id: str, line: int, result: dict[str, Any]) -> bool:
        results = self._results.setdefault((tenant, batch_id), {})
        if line in results:
            return False
        results[line] = result
        return True

    async def results(self, tenant: str, batch_id: str) -> dict[int, dict[str, Any]]:
        return dict(self._results.get((tenant, batch_id), {}))

    async def request_cancel(self, tenant: str, batch_id: str, at: int) -> int:
        return self._cancels.setdefault((tenant, batch_id), at)

    async def cancel_requested(self, tenant: str, batch_id: str) -> int | None:
        return self._cancels.get((tenant, batch_id))

    async def aclose(self) -> None:
        return None


# KEYS: lease. ARGV: owner, lease ms. Take it when free, renew it when ours.
_CLAIM_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
UNFINISHED_KEY = "batches:unfinished"


class RedisBatches(RedisJsonStore):
    """Every replica's batches, in Redis (see the module docstring)."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._claim = client.register_script(_CLAIM_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    @staticmethod
    def _member(tenant: str, batch_id: str) -> str:
        return json.dumps([tenant, batch_id])

    async def save(self, tenant: str, batch: dict[str, Any]) -> None:
        key = self._key("batch", tenant, batch["id"])
        async with redis_errors_as_unavailable("keeping a batch"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(key, self._blob(batch, key), ex=self._ttl_s)
            pipe.zadd(self._key("batches", tenant, "index"), {batch["id"]: batch["created_at"]})
            pipe.expire(self._key("batches", tenant, "index"), self._ttl_s)
            member = self._member(tenant, batch["id"])
            if batch["status"] in TERMINAL:
                pipe.srem(self._prefix + UNFINISHED_KEY, member)
            else:
                pipe.sadd(self._prefix + UNFINISHED_KEY, member)
            await pipe.execute()

    async def load(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        key = self._key("batch", tenant, batch_id)
        async with redis_errors_as_unavailable("reading a batch"):
            blob = await self._redis.get(key)
        return None if blob is None else self._value(blob, key)

    async def listing(self, tenant: str) -> list[dict[str, Any]]:
        index = self._key("batches", tenant, "index")
        async with redis_errors_as_unavailable("listing batches"):
            ids = [i.decode() for i in await self._redis.zrange(index, 0, -1)]
        batches = [await self.load(tenant, batch_id) for batch_id in ids]
        return [batch for batch in batches if batch is not None]

    async def unfinished(self) -> list[tuple[str, str]]:
        async with redis_errors_as_unavailable("listing batches to run"):
            members = await self._redis.smembers(self._prefix + UNFINISHED_KEY)
        found = []
        for member in members:
            tenant, batch_id = json.loads(member)
            if await self.load(tenant, batch_id) is None:  # expired with the store's TTL
                await self._redis.srem(self._prefix + UNFINISHED_KEY, member)
                continue
            found.append((tenant, batch_id))
        return found

    async def claim(self, tenant: str, batch_id: str, owner: str, lease_s: float) -> bool:
        async with redis_errors_as_unavailable("claiming a batch"):
            return bool(
                await self._claim(keys=[self._key("batchlease", tenant, batch_id)], args=[owner, int(lease_s * 1000)])
            )

    async def release(self, tenant: str, batch_id: str, owner: str) -> None:
        async with redis_errors_as_unavailable("releasing a batch"):
            await self._release(keys=[self._key("batchlease", tenant, batch_id)], args=[owner])

    async def keep_result(self, tenant: str, batch_id: str, line: int, result: dict[str, Any]) -> bool:
        key = self._key("batchresults", tenant, batch_id)
        async with redis_errors_as_unavailable("keeping a batch line's result"):
            kept = await self._redis.hsetnx(key, str(line), self._blob(result, f"{key}:{line}"))
            await self._redis.expire(key, self._ttl_s)
        return bool(kept)

    async def results(self, tenant: str, batch_id: str) -> dict[int, dict[str, Any]]:
        key = self._key("batchresults", tenant, batch_id)
        async with redis_errors_as_unavailable("reading a batch's results"):
            kept = await self._redis.hgetall(key)
        return {int(line): self._value(blob, f"{key}:{int(line)}") for line, blob in kept.items()}

    async def request_cancel(self, tenant: str, batch_id: str, at: int) -> int:
        key = self._key("batchcancel", tenant, batch_id)
        async with redis_errors_as_unavailable("cancelling a batch"):
            await self._redis.set(key, at, nx=True, ex=self._ttl_s)
            return int(await self._redis.get(key))

    async def cancel_requested(self, tenant: str, batch_id: str) -> int | None:
        async with redis_errors_as_unavailable("reading a batch"):
            value = await self._redis.get(self._key("batchcancel", tenant, batch_id))
        return None if value is None else int(value)
