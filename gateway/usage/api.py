"""`GET /v1/usage/records`: the usage ledger's records of a tenant, for admins (keys of GATEWAY_ADMIN_TENANTS).

Query: `tenant` (required), `since` (Unix seconds, default 0), `after` (the cursor: the `last_id` of the page
before), `limit` (1-1000, default 100). The answer is a list page as OpenAI's lists are: `data` oldest first,
each record with its cursor as `id`, `first_id`, `last_id`, `has_more`.
"""

from __future__ import annotations

import re

from aiohttp import web

from state import StoreUnavailable
from state.keys import TENANT_PATTERN
from state.usage_ledger import MAX_PAGE

from ..errors import ApiError, invalid, unavailable
from ..json_out import json_response
from ..services import SERVICES
from ..tenants.tenancy import tenant_of

CURSOR = re.compile(r"^\d{1,20}-\d{1,20}$")


def _number(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise invalid(name, f"'{name}' must be a whole number from {low} to {high}.")
    return int(raw)


def require_admin(request: web.Request, what: str) -> None:
    """A 403 unless the request's key is an admin tenant's (GATEWAY_ADMIN_TENANTS)."""
    if tenant_of(request) not in request.app[SERVICES].settings.admin_tenants:
        raise ApiError(
            403,
            f"You have insufficient permissions for this operation: {what} are for admin keys (GATEWAY_ADMIN_TENANTS).",
            code="insufficient_permissions",
        )


async def list_usage_records(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    require_admin(request, "usage records")
    tenant = request.query.get("tenant", "")
    if not TENANT_PATTERN.match(tenant):
        raise invalid("tenant", "'tenant' must name a tenant (letters, digits, '.', '_', '-'; 1-64).")
    after = request.query.get("after")
    if after is not None and not CURSOR.match(after):
        raise invalid("after", "'after' must be a cursor from an earlier page (its last_id).")
    since = _number(request, "since", 0, 0, 10**11)
    limit = _number(request, "limit", 100, 1, MAX_PAGE)
    try:
        page = await services.ledger.page(tenant, since, after, limit)
    except StoreUnavailable as exc:
        raise unavailable("The usage ledger is unavailable; try again.") from exc
    data = [{"id": cursor, **record.to_json()} for cursor, record in zip(page.cursors, page.records, strict=True)]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": page.cursors[0] if page.cursors else None,
            "last_id": page.cursors[-1] if page.cursors else None,
            "has_more": page.has_more,
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/usage/records", list_usage_records)
