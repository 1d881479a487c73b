"""Who is calling: Bearer API keys mapped to tenants (or one default tenant when auth is off).

Keys are looked up by their HMAC (the server secret is the pepper), first in the keys file, then in
Redis; the stored hash is compared with `hmac.compare_digest`. Redis answers are cached for
`KEY_CACHE_S`, so a revoked key stops working within that time on every replica. When the key store
cannot be reached and the key is not cached, the request gets a 503: authentication fails closed.
"""

from __future__ import annotations

import hmac
import time

import structlog
from aiohttp import web

from state import StoreUnavailable
from state.keys import KeyRecord, KeySource, hash_key

from ..errors import ApiError, unavailable

log = structlog.get_logger("gateway.auth")

DEFAULT_TENANT = "default"
KEY_CACHE_S = 5.0
KEY_CACHE_SIZE = 10_000
MAX_KEY_CHARS = 256
TENANT = web.RequestKey("tenant", str)  # where the app's middleware leaves the request's tenant
KEY_ID = web.RequestKey("key_id", str)  # and the id of the API key it came with ("" with authentication off)
# the batch runner's private app (batches/loopback.py): its requests name their tenant and key id in headers,
# which only that app believes
LOOPBACK = web.AppKey("loopback", bool)
LOOPBACK_TENANT_HEADER = "X-Gateway-Batch-Tenant"
LOOPBACK_KEY_HEADER = "X-Gateway-Batch-Key"
LOOPBACK_LINE_HEADER = "X-Gateway-Batch-Line"  # "batch_id/custom_id": the ledger bills a line once


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


class Authenticator:
    def __init__(self, secret: bytes | None, sources: list[KeySource]) -> None:
        self._secret = secret
        self._sources = sources
        self._cache: dict[str, tuple[float, KeyRecord]] = {}

    @classmethod
    def off(cls) -> Authenticator:
        return cls(None, [])

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    async def caller(self, authorization: str | None) -> tuple[str, str]:
        """(tenant, key id) of the request's API key; ("default", "") with authentication off."""
        if self._secret is None:
            return DEFAULT_TENANT, ""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _unauthorized("You didn't provide an API key: send it as 'Authorization: Bearer KEY'.")
        if len(key) > MAX_KEY_CHARS or not key.isascii() or not key.isprintable():  # keys are sk- and base64url
            raise _unauthorized("Incorrect API key provided.")
        key_hash = hash_key(self._secret, key)
        record = await self._find(key_hash)
        if record is None or not hmac.compare_digest(record.hash, key_hash):
            raise _unauthorized("Incorrect API key provided.")
        return record.tenant, record.id

    async def _find(self, key_hash: str) -> KeyRecord | None:
        cached = self._cache.get(key_hash)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        for source in self._sources:
            try:
                record = await source.find(key_hash)
            except StoreUnavailable as exc:
                raise unavailable("The API key store is unavailable; try again.") from exc
            if record is not None:
                if len(self._cache) >= KEY_CACHE_SIZE:
                    self._cache.clear()
                self._cache[key_hash] = (now + KEY_CACHE_S, record)
                return record
        return None

    async def aclose(self) -> None:
        for source in self._sources:
            await source.aclose()
