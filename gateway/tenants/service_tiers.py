"""Which service tier a request runs at: the one it asks for when its tenant is allowed it, else the tenant's
`auto` tier, as OpenAI's projects decide (GATEWAY_LIMITS `service_tiers` and `auto_service_tier`).

The API's names map onto the three the backends schedule by: `fast` and `ultrafast` are priority processing
(OpenAI answers `priority` for `fast`), `scale` is the default tier. The tier echoed is the one applied: a backend
that cannot schedule by tier runs everything as `default`, and says so.
"""

from __future__ import annotations

from aiohttp import web

from backends.base import Backend, SchedulingTier

from .limits import TenantLimits

FORCED_TIER = web.RequestKey("forced_tier", str)  # a batch's line runs at flex, whatever it asks

_ASKED: dict[str, SchedulingTier] = {
    "priority": "priority",
    "fast": "priority",
    "ultrafast": "priority",
    "default": "default",
    "scale": "default",
    "flex": "flex",
}


def applied_tier(
    asked: str | None, limits: TenantLimits, backend: Backend, request: web.Request | None = None
) -> SchedulingTier:
    """The tier a request asking for `asked` (None: auto) runs at on `backend`; a batch's line at flex."""
    if not backend.capabilities.service_tiers:
        return "default"
    if request is not None and FORCED_TIER in request:
        return "flex"
    tier = limits.auto_service_tier if asked is None or asked == "auto" else _ASKED.get(asked, "default")
    return tier if tier in limits.service_tiers else limits.auto_service_tier
