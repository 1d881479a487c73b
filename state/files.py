"""Files (the Files API: batch input and output files), tenant-scoped, bounded per tenant.

A file is its metadata and its content in chunks of CHUNK_BYTES, each sealed on its own when encryption at rest
is on, so a download streams chunk by chunk and never holds a whole file. A tenant's files count against a
byte and a file budget, checked and charged in the same step that keeps the file (a Lua script in Redis), so
replicas uploading at once cannot pass it together. A file expires at its `expires_at` (the keys' TTL in Redis);
DELETE removes the metadata, every chunk and the charge at once, and is final.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .redis_client import redis_errors_as_unavailable
from .redis_json_store import RedisJsonStore

CHUNK_BYTES = 1 << 20


@dataclass(slots=True)
class StoredFile:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class OverBudget(Exception):
    """The tenant's files would exceed its byte or file budget."""


class FileStore(Protocol):
    async def put(self, file: StoredFile, content: bytes, budgeted: bool = True) -> None:
        """Keep the file; OverBudget when the tenant's budget has no room for it (`budgeted` False: charged but
        never refused, as a batch's output files are)."""
        ...

    async def load(self, tenant: str, file_id: str) -> StoredFile | None: ...

    def content(self, tenant: str, file: StoredFile) -> AsyncIterator[bytes]:
        """The file's content, chunk by chunk (empty when it went meanwhile)."""
        ...

    async def listing(self, tenant: str) -> list[StoredFile]:
        """The tenant's files, oldest first."""
        ...

    async def delete(self, tenant: str, file_id: str) -> bool: ...

    async def aclose(self) -> None: ...


def chunks_of(content: bytes) -> list[bytes]:
    return [content[at : at + CHUNK_BYTES] for at in range(0, len(content), CHUNK_BYTES)] or [b""]


class MemoryFiles:
    """This process's files (no Redis)."""

    def __init__(self, tenant_bytes: int, tenant_files: int) -> None:
        self._tenant_bytes = tenant_bytes
        self._tenant_files = tenant_files
        self._files: dict[str, dict[str, tuple[StoredFile, list[bytes]]]] = {}

    def _live(self, tenant: str) -> dict[str, tuple[StoredFile, list[bytes]]]:
        files = self._files.setdefault(tenant, {})
        now = time.time()
        for file_id in [i for i, (f, _) in files.items() if f.expired(now)]:
            del files[file_id]
        return files

    async def put(self, file: StoredFile, content: bytes, budgeted: bool = True) -> None:
        files = self._live(file.tenant)
        used = sum(f.bytes for f, _ in files.values())
        if budgeted and (used + file.bytes > self._tenant_bytes or len(files) + 1 > self._tenant_files):
            raise OverBudget
        files[file.id] = (file, chunks_of(content))

    async def load(self, tenant: str, file_id: str) -> StoredFile | None:
        kept = self._live(tenant).get(file_id)
        return kept[0] if kept else None

    async def content(self, tenant: str, file: StoredFile) -> AsyncIterator[bytes]:
        kept = self._live(tenant).get(file.id)
        for chunk in kept[1] if kept else ():
            yield chunk

    async def listing(self, tenant: str) -> list[StoredFile]:
        return sorted((f for f, _ in self._live(tenant).values()), key=lambda f: (f.created_at, f.id))

    async def delete(self, tenant: str, file_id: str) -> bool:
        return self._live(tenant).pop(file_id, None) is not None

    async def aclose(self) -> None:
        return None


# KEYS: usage hash (bytes, files), index zset, meta key, expiry zset (member "id:bytes", score expires_at).
# ARGV: bytes, byte budget, file budget, score, id, meta blob, expires_at (0: never), now.
# Files past their expiry are uncharged first (their chunks expire by their own TTL); chunks are written before,
# under keys only this meta names.
_PUT_LUA = """
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[8])) do
  local at = string.find(gone, ':', 1, true)
  local id = string.sub(gone, 1, at - 1)
  redis.call('HINCRBY', KEYS[1], 'bytes', -tonumber(string.sub(gone, at + 1)))
  redis.call('HINCRBY', KEYS[1], 'files', -1)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[4], gone)
  redis.call('DEL', ARGV[9] .. id)
end
local used = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local count = tonumber(redis.call('HGET', KEYS[1], 'files') or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) or count + 1 > tonumber(ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'files', 1)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('SET', KEYS[3], ARGV[6])
if tonumber(ARGV[7]) > 0 then redis.call('ZADD', KEYS[4], ARGV[7], ARGV[5] .. ':' .. ARGV[1]) end
return 1
"""

# KEYS: usage hash, index zset, meta key, expiry zset. ARGV: id, bytes, chunk key prefix, chunk count.
_DELETE_LUA = """
if redis.call('DEL', KEYS[3]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1] .. ':' .. ARGV[2])
redis.call('HINCRBY', KEYS[1], 'bytes', -tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'files', -1)
for n = 0, tonumber(ARGV[4]) - 1 do redis.call('DEL', ARGV[3] .. n) end
return 1
"""


class RedisFiles(RedisJsonStore):
    """Every replica's files, in Redis (see the module docstring)."""

    def __init__(self, client: Any, tenant_bytes: int, tenant_files: int, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._tenant_bytes = tenant_bytes
        self._tenant_files = tenant_files
        self._put = client.register_script(_PUT_LUA)
        self._delete = client.register_script(_DELETE_LUA)

    def _chunk_key(self, tenant: str, file_id: str, n: int) -> str:
        return f"{self._key('filechunk', tenant, file_id)}:{n}"

    def _usage_keys(self, tenant: str, file_id: str) -> list[str]:
        return [
            self._key("files", tenant, "usage"),
            self._key("files", tenant, "index"),
            self._key("file", tenant, file_id),
            self._key("files", tenant, "expiry"),
        ]

    async def put(self, file: StoredFile, content: bytes, budgeted: bool = True) -> None:
        chunks = chunks_of(content)
        byte_budget, file_budget = (self._tenant_bytes, self._tenant_files) if budgeted else (2**53, 2**53)
        async with redis_errors_as_unavailable("keeping a file"):
            pipe = self._redis.pipeline(transaction=False)
            for n, chunk in enumerate(chunks):
                key = self._chunk_key(file.tenant, file.id, n)
                sealed = chunk if self._cipher is None else self._cipher.seal(chunk, key)
                if file.expires_at is not None:
                    pipe.set(key, sealed, exat=file.expires_at)
                else:
                    pipe.set(key, sealed)
            await pipe.execute()
            meta_key = self._key("file", file.tenant, file.id)
            kept = await self._put(
                keys=self._usage_keys(file.tenant, file.id),
                args=[file.bytes, byte_budget, file_budget, file.created_at, file.id,
                      self._blob({**asdict(file), "chunks": len(chunks)}, meta_key), file.expires_at or 0,
                      int(time.time()), self._key("file", file.tenant, "")],
            )  # fmt: skip
            if not kept:
                await self._redis.delete(*(self._chunk_key(file.tenant, file.id, n) for n in range(len(chunks))))
                raise OverBudget

    async def _meta(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        key = self._key("file", tenant, file_id)
        async with redis_errors_as_unavailable("reading a file"):
            blob = await self._redis.get(key)
        return None if blob is None else self._value(blob, key)

    async def load(self, tenant: str, file_id: str) -> StoredFile | None:
        meta = await self._meta(tenant, file_id)
        if meta is None:
            return None
        meta.pop("chunks", None)
        file = StoredFile(**meta)
        return None if file.expired(time.time()) else file

    async def content(self, tenant: str, file: StoredFile) -> AsyncIterator[bytes]:
        meta = await self._meta(tenant, file.id)
        for n in range(meta["chunks"] if meta else 0):
            key = self._chunk_key(tenant, file.id, n)
            async with redis_errors_as_unavailable("reading a file"):
                blob = await self._redis.get(key)
            if blob is None:
                return
            yield blob if self._cipher is None else self._cipher.open(blob, key)

    async def listing(self, tenant: str) -> list[StoredFile]:
        async with redis_errors_as_unavailable("listing files"):
            ids = [i.decode() for i in await self._redis.zrange(self._key("files", tenant, "index"), 0, -1)]
        files = [await self.load(tenant, file_id) for file_id in ids]
        return [file for file in files if file is not None]  # expired ones are uncharged at the next upload

    async def delete(self, tenant: str, file_id: str) -> bool:
        meta = await self._meta(tenant, file_id)
        async with redis_errors_as_unavailable("deleting a file"):
            if meta is None or StoredFile(**{k: v for k, v in meta.items() if k != "chunks"}).expired(time.time()):
                return False
            deleted = await self._delete(
                keys=self._usage_keys(tenant, file_id),
                args=[file_id, meta["bytes"], self._chunk_key(tenant, file_id, 0)[:-1], meta["chunks"]],
            )
        return bool(deleted)
