"""`GET /v1/admin/engine_queues`: each built-in engine's queues by tenant and service tier, for admins.

For each in-process engine backend: per tenant and tier, the sequences running and waiting, those admitted since
start and the mean wait from arrival to admission; and each active tenant's share of the batch (its weight over
the active tenants' weights), as the fair share divides it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from backends.base import EngineStats, ReportsEngineStats

from ..json_out import json_response
from ..services import SERVICES
from .api import require_admin


def _queues(stats: EngineStats) -> dict[str, Any]:
    active = {tenant for (tenant, _), queue in stats.queues.items() if queue.running or queue.waiting}
    weights = {tenant: queue.weight for (tenant, _), queue in stats.queues.items()}
    total = sum(weights[tenant] for tenant in active)
    rows = [
        {
            "tenant": tenant,
            "service_tier": tier,
            "running": queue.running,
            "waiting": queue.waiting,
            "admitted": queue.admitted,
            "mean_wait_s": round(queue.wait_seconds / queue.admitted, 6) if queue.admitted else None,
            "weight": queue.weight,
            "share": round(queue.weight / total, 6) if tenant in active else 0.0,
        }
        for (tenant, tier), queue in sorted(stats.queues.items())
    ]
    return {"running": stats.running, "waiting": stats.waiting, "max_batch": stats.max_batch, "queues": rows}


async def engine_queues(request: web.Request) -> web.Response:
    require_admin(request, "engine queues")
    services = request.app[SERVICES]
    engines: dict[str, Any] = {}
    for model, backend in services.backends.items():
        stats = backend.engine_stats() if isinstance(backend, ReportsEngineStats) else None
        if stats is not None:
            engines[model] = _queues(stats)
    return json_response({"object": "engine_queues", "engines": engines})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/admin/engine_queues", engine_queues)
