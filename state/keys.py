"""API keys at rest: only an HMAC-SHA256 of each key (with a server secret) is kept, in a file or in Redis.

A key is `sk-` followed by 43 url-safe characters (256 random bits). A record holds its id (for
listing and revoking), its tenant, a label, its creation time and its hash — never the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from .redis_client import connect, redis_errors_as_unavailable

TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class KeyAdminError(ValueError):
    """A key operation cannot be done (bad tenant name, unknown id, unreadable file)."""


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    tenant: str
    name: str
    created_at: int
    hash: str

    def public(self) -> dict[str, Any]:
        """What `keys list` shows: everything but the hash."""
        return {"id": self.id, "tenant": self.tenant, "name": self.name, "created_at": self.created_at}


def new_key() -> str:
    return "sk-" + secrets.token_urlsafe(32)


def hash_key(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def new_record(secret: bytes, tenant: str, name: str) -> tuple[str, KeyRecord]:
    """A fresh key (shown once) and the record to store."""
    if not TENANT_PATTERN.match(tenant):
        raise KeyAdminError(f"tenant '{tenant}' must match {TENANT_PATTERN.pattern}")
    key = new_key()
    record = KeyRecord("key_" + secrets.token_hex(8), tenant, name[:128], int(time.time()), hash_key(secret, key))
    return key, record


class KeySource(Protocol):
    async def find(self, key_hash: str) -> KeyRecord | None: ...

    async def aclose(self) -> None: ...


class FileKeys:
    """A JSON file `{"keys": [record, ...]}`: for operators who manage keys as configuration.

    Its admin methods are coroutines like RedisKeys' so that the CLI treats both stores alike.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._by_hash = {record.hash: record for record in self._read()}

    def _read(self) -> list[KeyRecord]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
            return [KeyRecord(**entry) for entry in data["keys"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyAdminError(f"cannot read the keys file {self.path}: {exc}") from exc

    async def find(self, key_hash: str) -> KeyRecord | None:
        return self._by_hash.get(key_hash)

    def _write(self, records: list[KeyRecord]) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"keys": [asdict(r) for r in records]}, indent=1))
        os.chmod(temporary, 0o600)
        temporary.replace(self.path)
        self._by_hash = {record.hash: record for record in records}

    async def records(self) -> list[KeyRecord]:
        return self._read()

    async def add(self, record: KeyRecord) -> None:
        self._write([*self._read(), record])

    async def revoke(self, key_id: str) -> bool:
        records = self._read()
        kept = [r for r in records if r.id != key_id]
        if len(kept) != len(records):
            self._write(kept)
        return len(kept) != len(records)

    async def aclose(self) -> None:
        return None


class RedisKeys:
    """Keys in Redis: `gw:apikey:<hash>` → record JSON, and the index hash `gw:apikeys` (id → hash)."""

    def __init__(self, client: Any, prefix: str = "gw:") -> None:
        self._redis = client
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str) -> RedisKeys:
        return cls(connect(url))

    def _key(self, key_hash: str) -> str:
        return f"{self._prefix}apikey:{key_hash}"

    async def _call(self, method: str, *args: Any) -> Any:
        async with redis_errors_as_unavailable("keys"):
            return await getattr(self._redis, method)(*args)

    async def find(self, key_hash: str) -> KeyRecord | None:
        raw = await self._call("get", self._key(key_hash))
        return None if raw is None else KeyRecord(**json.loads(raw))

    async def add(self, record: KeyRecord) -> None:
        await self._call("set", self._key(record.hash), json.dumps(asdict(record)))
        await self._call("hset", f"{self._prefix}apikeys", record.id, record.hash)

    async def records(self) -> list[KeyRecord]:
        index = await self._call("hgetall", f"{self._prefix}apikeys")
        found = [await self.find(h.decode()) for h in index.values()]
        return sorted((r for r in found if r is not None), key=lambda r: (r.created_at, r.id))

    async def revoke(self, key_id: str) -> bool:
        key_hash = await self._call("hget", f"{self._prefix}apikeys", key_id)
        if key_hash is None:
            return False
        await self._call("delete", self._key(key_hash.decode()))
        await self._call("hdel", f"{self._prefix}apikeys", key_id)
        return True

    async def aclose(self) -> None:
        await self._redis.aclose()
