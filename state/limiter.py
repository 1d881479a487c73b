"""Rate and concurrency counters for per-tenant limits: Redis (shared by replicas) and in-memory.

Rates use GCRA (the generic cell rate algorithm): one number per key, the theoretical arrival time,
timed by the Redis server's clock, so replicas with skewed clocks agree. A charge of `cost` units at
`per_minute` units a minute with `burst` units of tolerance is admitted or refused with the exact
time after which it would be admitted. A negative cost refunds (a token reservation settled lower).
Concurrency uses a sorted set of leases that expire, so a replica that dies does not leak slots.
Every script touches one key, and the keys carry the tenant's hash tag, so they run on Redis Cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from .redis_client import connect, redis_errors_as_unavailable, tenant_tag


@dataclass(frozen=True, slots=True)
class RateDecision:
    admitted: bool
    retry_after_s: float  # 0 when admitted
    remaining: float  # units that could still be charged now


class Limiter(Protocol):
    async def charge(self, tenant: str, name: str, per_minute: float, burst: float, cost: float) -> RateDecision: ...

    async def lease(self, tenant: str, name: str, limit: int, lease_id: str, ttl_s: float) -> bool: ...

    async def release(self, tenant: str, name: str, lease_id: str) -> None: ...

    async def renew(self, tenant: str, name: str, lease_ids: list[str], ttl_s: float) -> None: ...

    async def aclose(self) -> None: ...


def _gcra(tat: float, now: float, interval: float, burst: float, cost: float) -> tuple[RateDecision, float | None]:
    """The decision and the new arrival time to store (None: leave it)."""
    tat = max(tat, now)
    if cost < 0:
        return RateDecision(True, 0.0, 0.0), max(tat + cost * interval, now)
    new_tat = tat + cost * interval
    allow_at = new_tat - burst * interval
    if allow_at > now:
        return RateDecision(False, allow_at - now, max(0.0, (now - (tat - burst * interval)) / interval)), None
    return RateDecision(True, 0.0, (now - allow_at) / interval), new_tat


_GCRA_LUA = """
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if cost < 0 then
  local new = math.max(tat + cost * interval, now)
  if new > now then
    redis.call('SET', KEYS[1], string.format('%.6f', new), 'EX', math.ceil(new - now) + 1)
  else
    redis.call('DEL', KEYS[1])
  end
  return {1, '0', '0'}
end
local new = tat + cost * interval
local allow_at = new - burst * interval
if allow_at > now then
  local remaining = math.max(0, (now - (tat - burst * interval)) / interval)
  return {0, string.format('%.6f', allow_at - now), string.format('%.6f', remaining)}
end
redis.call('SET', KEYS[1], string.format('%.6f', new), 'EX', math.ceil(new - now) + 1)
return {1, '0', string.format('%.6f', (now - allow_at) / interval)}
"""

_LEASE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
return 1
"""

_RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i]) end
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
return 1
"""


class RedisLimiter:
    def __init__(self, client: Any, prefix: str = "gw:") -> None:
        self._redis = client
        self._prefix = prefix
        self._gcra = client.register_script(_GCRA_LUA)
        self._lease = client.register_script(_LEASE_LUA)
        self._renew = client.register_script(_RENEW_LUA)

    @classmethod
    def from_url(cls, url: str) -> RedisLimiter:
        return cls(connect(url))

    def _key(self, tenant: str, name: str) -> str:
        return f"{self._prefix}{tenant_tag(tenant)}:limit:{name}"

    async def _run(self, script: Any, key: str, args: list[Any]) -> Any:
        async with redis_errors_as_unavailable("limits"):
            return await script(keys=[key], args=args)

    async def charge(self, tenant: str, name: str, per_minute: float, burst: float, cost: float) -> RateDecision:
        admitted, retry, remaining = await self._run(
            self._gcra, self._key(tenant, name), [60.0 / per_minute, burst, cost]
        )
        return RateDecision(admitted == 1, float(retry), float(remaining))

    async def lease(self, tenant: str, name: str, limit: int, lease_id: str, ttl_s: float) -> bool:
        return await self._run(self._lease, self._key(tenant, name), [limit, lease_id, ttl_s]) == 1

    async def release(self, tenant: str, name: str, lease_id: str) -> None:
        async with redis_errors_as_unavailable("limits"):
            await self._redis.zrem(self._key(tenant, name), lease_id)

    async def renew(self, tenant: str, name: str, lease_ids: list[str], ttl_s: float) -> None:
        if lease_ids:
            await self._run(self._renew, self._key(tenant, name), [ttl_s, *lease_ids])

    async def aclose(self) -> None:
        await self._redis.aclose()


class MemoryLimiter:
    """The same algorithms in one process (the embedded default, and the fallback when Redis is down)."""

    def __init__(self) -> None:
        self._tats: dict[tuple[str, str], float] = {}
        self._leases: dict[tuple[str, str], dict[str, float]] = {}

    async def charge(self, tenant: str, name: str, per_minute: float, burst: float, cost: float) -> RateDecision:
        now = time.monotonic()
        key = (tenant, name)
        decision, new_tat = _gcra(self._tats.get(key, now), now, 60.0 / per_minute, burst, cost)
        if new_tat is not None:
            self._tats[key] = new_tat
        if len(self._tats) > 100_000:  # bounded: forget keys whose arrival time has passed
            self._tats = {k: v for k, v in self._tats.items() if v > now}
        return decision

    def _live(self, key: tuple[str, str]) -> dict[str, float]:
        now = time.monotonic()
        leases = {lease: expiry for lease, expiry in self._leases.get(key, {}).items() if expiry > now}
        self._leases[key] = leases
        return leases

    async def lease(self, tenant: str, name: str, limit: int, lease_id: str, ttl_s: float) -> bool:
        leases = self._live((tenant, name))
        if len(leases) >= limit:
            return False
        leases[lease_id] = time.monotonic() + ttl_s
        return True

    async def release(self, tenant: str, name: str, lease_id: str) -> None:
        leases = self._leases.get((tenant, name), {})
        leases.pop(lease_id, None)
        if not leases:
            self._leases.pop((tenant, name), None)

    async def renew(self, tenant: str, name: str, lease_ids: list[str], ttl_s: float) -> None:
        leases = self._live((tenant, name))
        for lease_id in lease_ids:
            if lease_id in leases:
                leases[lease_id] = time.monotonic() + ttl_s

    async def aclose(self) -> None:
        return None
