"""The shared store for many replicas: Redis standalone, Sentinel or Cluster (see `redis_client`).

Keys of one response, all under its tenant's hash tag (one Cluster slot, so the scripts below are
atomic on every topology): `resp:<id>` the record, `lease:<id>` its owner's lease while it runs,
`tomb:<id>` the tombstone a DELETE leaves, `calls:<id>` the tool-call ids whose CoT is indexed
(`cot:<call id>`), so a DELETE removes them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .record_cipher import SEALED, RecordCipher
from .records import RUNNING, StoredCot, StoredResponse, decode_cot, decode_response, encode, orphaned
from .redis_client import connect, redis_errors_as_unavailable, tenant_tag
from .store import DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S, StoreUnavailable

_Owned = TypeVar("_Owned", StoredResponse, StoredCot)

# KEYS: resp, lease, tomb. ARGV: blob, ttl seconds, lease milliseconds (0: the lease ends)
_SAVE_LUA = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', ARGV[3]) else redis.call('DEL', KEYS[2]) end
return 1
"""

# KEYS: resp, lease, tomb. ARGV: lease milliseconds. 0: deleted; 2: not there (lost, e.g. Redis restarted empty)
_RENEW_LUA = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
return 1
"""

# KEYS: resp, lease. Returns the record and whether a lease is held.
_LOAD_LUA = """
return {redis.call('GET', KEYS[1]), redis.call('EXISTS', KEYS[2])}
"""

# KEYS: resp, lease, tomb, calls. ARGV: ttl seconds, the cot key prefix (same hash tag)
_DELETE_LUA = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[3], '1', 'EX', ARGV[1])
for _, call in ipairs(redis.call('SMEMBERS', KEYS[4])) do redis.call('DEL', ARGV[2] .. call) end
redis.call('DEL', KEYS[4])
return 1
"""

# KEYS: tomb, calls, cot keys... ARGV: ttl seconds, blobs..., call ids...
_INDEX_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = #KEYS - 2
for i = 1, n do
  redis.call('SET', KEYS[i + 2], ARGV[i + 1], 'EX', ARGV[1])
  redis.call('SADD', KEYS[2], ARGV[n + 1 + i])
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""


class RedisStore:
    def __init__(
        self,
        client: Any,
        ttl_s: int = DEFAULT_TTL_S,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        prefix: str = "gw:",
        cipher: RecordCipher | None = None,
    ) -> None:
        self._redis = client
        self._cipher = cipher
        self._ttl_s = int(ttl_s)
        self._max_record_bytes = max_record_bytes
        self._prefix = prefix
        self._save = client.register_script(_SAVE_LUA)
        self._renew = client.register_script(_RENEW_LUA)
        self._load = client.register_script(_LOAD_LUA)
        self._delete = client.register_script(_DELETE_LUA)
        self._index = client.register_script(_INDEX_LUA)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisStore:
        return cls(connect(url), **kwargs)

    def _key(self, kind: str, tenant: str, ident: str) -> str:
        return f"{self._prefix}{tenant_tag(tenant)}:{kind}:{ident}"

    def _keys(self, tenant: str, response_id: str, *kinds: str) -> list[str]:
        return [self._key(kind, tenant, response_id) for kind in kinds]

    def _seal(self, blob: bytes, key: str) -> bytes:
        return blob if self._cipher is None else self._cipher.seal(blob, key)

    def _open(self, blob: bytes | None, key: str) -> bytes | None:
        if blob is None:
            return None
        if self._cipher is not None:
            return self._cipher.open(blob, key)
        if blob[:1] == SEALED:
            raise StoreUnavailable(
                "a stored record is encrypted and this gateway has no store encryption keys",
                reason="stored records are encrypted; set GATEWAY_STORE_ENCRYPTION and GATEWAY_REASONING_KEYS",
            )
        return blob

    async def _script(self, operation: str, script: Any, keys: list[str], args: list[Any]) -> Any:
        async with redis_errors_as_unavailable(operation):
            return await script(keys=keys, args=args)

    async def save(self, record: StoredResponse, lease_s: float | None = None) -> bool:
        keys = self._keys(record.tenant, record.id, "resp", "lease", "tomb")
        blob = self._seal(encode(record, self._max_record_bytes), keys[0])
        lease_ms = 0 if lease_s is None else max(1, int(lease_s * 1000))
        return await self._script("save", self._save, keys, [blob, self._ttl_s, lease_ms]) == 1

    async def renew(self, tenant: str, response_id: str, lease_s: float) -> bool:
        keys = self._keys(tenant, response_id, "resp", "lease", "tomb")
        return await self._script("renew", self._renew, keys, [max(1, int(lease_s * 1000))]) != 0

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        keys = self._keys(tenant, response_id, "resp", "lease")
        blob, leased = await self._script("load", self._load, keys, [])
        record = self._owned(tenant, self._open(blob, keys[0]), decode_response)
        if record is not None and record.response.get("status") in RUNNING and not leased:
            return orphaned(record)
        return record

    async def delete(self, tenant: str, response_id: str) -> bool:
        keys = self._keys(tenant, response_id, "resp", "lease", "tomb", "calls")
        cot_prefix = self._key("cot", tenant, "")
        return await self._script("delete", self._delete, keys, [self._ttl_s, cot_prefix]) == 1

    async def index_tool_calls(self, entries: list[StoredCot], response_id: str | None = None) -> bool:
        if not entries:
            return True
        tenant = entries[0].tenant
        if any(entry.tenant != tenant for entry in entries):
            raise ValueError("one index call holds one tenant's entries")
        cot_keys = [self._key("cot", tenant, entry.call_id) for entry in entries]
        blobs = [self._seal(encode(e, self._max_record_bytes), k) for e, k in zip(entries, cot_keys, strict=True)]
        if response_id is None:  # Chat: no response record to tie them to
            async with redis_errors_as_unavailable("index_tool_calls"), self._redis.pipeline(transaction=False) as pipe:
                for key, blob in zip(cot_keys, blobs, strict=True):
                    pipe.set(key, blob, ex=self._ttl_s)
                await pipe.execute()
            return True
        keys = [*self._keys(tenant, response_id, "tomb", "calls"), *cot_keys]
        args = [self._ttl_s, *blobs, *(entry.call_id for entry in entries)]
        return await self._script("index_tool_calls", self._index, keys, args) == 1

    def _owned(self, tenant: str, blob: bytes | None, decode: Callable[[bytes], _Owned]) -> _Owned | None:
        """The stored object, only if the tenant inside it is the caller's (defence in depth)."""
        found = None if blob is None else decode(blob)
        return found if found is not None and found.tenant == tenant else None

    async def find_cot(self, tenant: str, call_id: str) -> StoredCot | None:
        key = self._key("cot", tenant, call_id)
        async with redis_errors_as_unavailable("find_cot"):
            blob = await self._redis.get(key)
        return self._owned(tenant, self._open(blob, key), decode_cot)

    async def health(self) -> str | None:
        """A small write, so a full (`noeviction`) or read-only Redis is reported, not only a dead one."""
        try:
            async with redis_errors_as_unavailable("health"):
                await self._redis.set(f"{self._prefix}health", b"1", ex=10)
        except StoreUnavailable as exc:
            return exc.reason
        return None

    async def eviction_policy(self) -> str | None:
        """Redis's maxmemory-policy, or None where CONFIG GET is not allowed (as on managed services)."""
        try:
            async with redis_errors_as_unavailable("config"):
                found = await self._redis.config_get("maxmemory-policy")
        except StoreUnavailable:
            return None
        value = found.get("maxmemory-policy") if isinstance(found, dict) else None
        return value.decode() if isinstance(value, bytes) else value

    async def aclose(self) -> None:
        await self._redis.aclose()
