"""The base of the Redis stores beside the response store (event streams, conversations): one client, the
store's TTL, tenant-tagged keys, and JSON values sealed with the record cipher (encryption at rest), each
bound to the key it is kept under."""

from __future__ import annotations

from typing import Any, Self

from .fast_json import dumps, loads
from .record_cipher import RecordCipher
from .redis_client import connect, tenant_tag
from .store import DEFAULT_TTL_S


class RedisJsonStore:
    def __init__(
        self, client: Any, ttl_s: int = DEFAULT_TTL_S, prefix: str = "gw:", cipher: RecordCipher | None = None
    ) -> None:
        self._redis = client
        self._ttl_s = int(ttl_s)
        self._prefix = prefix
        self._cipher = cipher

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Self:
        return cls(connect(url), **kwargs)

    def _key(self, kind: str, tenant: str, ident: str) -> str:
        return f"{self._prefix}{tenant_tag(tenant)}:{kind}:{ident}"

    def _blob(self, value: Any, key: str) -> bytes:
        blob = dumps(value)
        return blob if self._cipher is None else self._cipher.seal(blob, key)

    def _value(self, blob: bytes, key: str) -> Any:
        return loads(blob if self._cipher is None else self._cipher.open(blob, key))

    async def aclose(self) -> None:
        await self._redis.aclose()
