"""Per-tenant salts for a model server's prefix cache (vLLM's `cache_salt`): a tenant's prompts are reused only
for that tenant, so no tenant learns from `cached_tokens` or time to first token what another sent.

A salt is an HMAC of the tenant under a secret every gateway replica shares (by default the gateway's API-key
secret, `GATEWAY_KEY_SECRET`), so a tenant's requests share their cache on every replica while the salt stays
unguessable, as vLLM asks (256 bits, base64). Without the secret, a random one per process: tenants stay apart,
but replicas do not share a tenant's cache.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

import structlog

log = structlog.get_logger("backends.cache_salt")

DOMAIN = b"gpt-oss-gateway cache salt\0"


class TenantSalt:
    def __init__(self, secret_env: str) -> None:
        secret = os.environ.get(secret_env, "").encode()
        if not secret:
            log.warning("cache_salt_secret_missing", variable=secret_env, effect="salts are this process's own")
            secret = secrets.token_bytes(32)
        self._secret = secret
        self._salts: dict[str, str] = {}

    def __call__(self, tenant: str) -> str:
        salt = self._salts.get(tenant)
        if salt is None:
            digest = hmac.new(self._secret, DOMAIN + tenant.encode(), hashlib.sha256).digest()
            salt = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if len(self._salts) < 65_536:
                self._salts[tenant] = salt
        return salt
