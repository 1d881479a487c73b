"""aiohttp application factory: routes, shared services, health endpoints, orderly shutdown."""

from __future__ import annotations

from aiohttp import web

from harmony import Renderer, load_harmony_encoding

from .auth import TENANT
from .chat_api import add_routes as add_chat_routes
from .config import Settings
from .errors import ApiError, error_middleware
from .models_api import add_routes as add_models_routes
from .openapi import serve_openapi
from .responses_api import add_routes as add_responses_routes
from .services import SERVICES, Services, build_services


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process serves requests (no dependency is checked)."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the vocabulary is loaded and the response store answers."""
    services = request.app[SERVICES]
    store_ok = await services.store.ping()
    body = {
        "status": "ready" if store_ok else "unavailable",
        "vocab_size": services.encoding.vocab_size,
        "store": "ok" if store_ok else "unreachable",
    }
    return web.json_response(body, status=200 if store_ok else 503)


@web.middleware
async def tenant_middleware(request: web.Request, handler):
    """Every /v1/ request gets its tenant from its API key (or a 401) before the route runs."""
    if request.path.startswith("/v1/"):
        services = request.app[SERVICES]
        tenant = await services.auth.tenant_for(request.headers.get("Authorization"))
        request[TENANT] = tenant
        cap = services.settings.limits.for_tenant(tenant).max_body_bytes
        if cap is not None and (request.content_length or 0) > cap:
            raise ApiError(413, f"The request body is over this API key's limit of {cap} bytes.", code="body_too_large")
    return await handler(request)


def create_app(settings: Settings, services: Services | None = None) -> web.Application:
    """`services` lets tests inject a backend or store; by default they come from the settings."""
    middlewares = [error_middleware, tenant_middleware]
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[SERVICES] = services or build_services(settings, Renderer(load_harmony_encoding(settings.vocab_path)))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", serve_openapi)
    add_responses_routes(app)
    add_chat_routes(app)
    add_models_routes(app)

    async def close_services(app: web.Application) -> None:
        await app[SERVICES].aclose()

    app.on_cleanup.append(close_services)
    return app
