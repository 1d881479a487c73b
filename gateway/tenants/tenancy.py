"""Which tenant a request belongs to (resolved from its API key by the app's middleware), and its id."""

from __future__ import annotations

import re

from aiohttp import web

from .auth import KEY_ID, TENANT

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
REQUEST_ID = web.RequestKey("request_id", str)  # the id a route chose; the middleware echoes and logs it


def tenant_of(request: web.Request) -> str:
    return request[TENANT]


def key_id_of(request: web.Request) -> str | None:
    """The id of the API key the request came with (None with authentication off)."""
    return request.get(KEY_ID) or None


def valid_request_id(given: str) -> str | None:
    return given if _REQUEST_ID.match(given) else None


def request_id_of(request: web.Request, fallback: str) -> str:
    """The client's X-Request-ID when it is well formed, else ours (remembered for the response header)."""
    chosen = valid_request_id(request.headers.get("X-Request-ID", "")) or fallback
    request[REQUEST_ID] = chosen
    return chosen
