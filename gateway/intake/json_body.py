"""Request bodies read and validated: JSON within the bounds of body_decoding.py, as API models.

Nothing here holds the event loop past its budget: a compressed body (gzip, deflate, zstd, br) is inflated,
at most GATEWAY_MAX_BODY_BYTES of it, and a body past OFFLOAD_BYTES parsed and checked, as the tenant's costly
work, in a checker process (checker_pool.py). Where no checker answers, a worker thread decodes it: past
C_PARSE_BYTES by the json module's Python scanner, which lets the loop run between its steps (the C parser holds
the interpreter for its whole run: ~30 ms a MiB here).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from ..errors import ApiError, from_validation, invalid
from .body_decoding import decode_body, parse_json
from .checker_pool import Check
from .costly_work import CostlyWork

ModelT = TypeVar("ModelT", bound=BaseModel)
OFFLOAD_BYTES = 64 * 1024  # a body this large or larger is decoded in a worker thread
BODY_BYTES = web.RequestKey("body_bytes", int)  # the decoded body's size, once read


class _TenantBodyLimit(Protocol):
    @property
    def max_body_bytes(self) -> int | None: ...


class _Limits(Protocol):
    def for_tenant(self, tenant: str) -> _TenantBodyLimit: ...


class _IntakeSettings(Protocol):
    @property
    def body_timeout_s(self) -> float: ...
    @property
    def max_body_bytes(self) -> int: ...
    @property
    def limits(self) -> _Limits: ...


class IntakeServices(Protocol):
    """What reading a body needs of the app's services (gateway.services.Services has it)."""

    @property
    def settings(self) -> _IntakeSettings: ...
    @property
    def costly(self) -> CostlyWork: ...


INTAKE = web.AppKey("intake", IntakeServices)  # the app's services, as reading a body sees them


async def read_json(request: web.Request, tenant: str, check: Check | None = None) -> Any:
    """The request body as JSON, or a 400/413/415 that says what is wrong with it. `check`: the API's checks of
    the body alone, run on a large body in a checker process before the gateway decodes it (they run again later
    on the request path: a small body, or one no checker could take, gets them there)."""
    try:
        if request.content.is_eof():  # all of it arrived with the head (a small body): nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(request.app[INTAKE].settings.body_timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"Request body too large. {exc.text}", code="request_too_large") from exc
    except TimeoutError:
        raise ApiError(408, "The request body did not arrive in time.", code="request_timeout") from None
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    services = request.app[INTAKE]
    settings = services.settings
    limit = min(settings.max_body_bytes, settings.limits.for_tenant(tenant).max_body_bytes or settings.max_body_bytes)
    if encoding == "identity" and len(raw) < OFFLOAD_BYTES:
        request[BODY_BYTES] = len(raw)
        return parse_json(raw)
    checked = await services.costly.check(tenant, raw, encoding, limit, check)
    if checked is not None:
        request[BODY_BYTES] = checked.size
        return checked.body
    body, size = await services.costly.run(tenant, lambda: decode_body(raw, encoding, limit, stepwise=True))
    request[BODY_BYTES] = size
    return body


def body_bytes(request: web.Request) -> int | None:
    """The size of the body read_json decoded (None before it did)."""
    return request.get(BODY_BYTES)


async def read_model(
    request: web.Request,
    tenant: str,
    model: type[ModelT],
    tags: frozenset[str] = frozenset(),
    check: Check | None = None,
) -> ModelT:
    """The JSON body validated as `model`; `tags` name the union tags to leave out of parameter paths; `check`
    as read_json takes it."""
    return parse_model(await read_json(request, tenant, check), model, tags)


def parse_model(body: Any, model: type[ModelT], tags: frozenset[str] = frozenset()) -> ModelT:
    """A JSON body already read, validated as `model` (400s as read_model gives them)."""
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", "invalid_type")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc, tags) from exc
