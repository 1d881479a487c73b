"""Which tenant a request belongs to: the SHA-256 of its bearer key (keys are never kept in clear)."""

from __future__ import annotations

import hashlib
import re

from aiohttp import web

ANONYMOUS = "anonymous"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def tenant_of(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return ANONYMOUS
    return "key:" + hashlib.sha256(key.strip().encode()).hexdigest()


def request_id_of(request: web.Request, fallback: str) -> str:
    """The client's X-Request-ID when it is well formed, else ours."""
    given = request.headers.get("X-Request-ID", "")
    return given if _REQUEST_ID.match(given) else fallback
