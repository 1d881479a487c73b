"""aiohttp application factory: routes, shared services, health endpoints, orderly shutdown."""

from __future__ import annotations

import time

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from harmony import Renderer, load_harmony_encoding

from .batches.batches_api import add_routes as add_batch_routes
from .batches.files_api import add_routes as add_file_routes
from .batches.loopback import Loopback
from .batches.runner import BatchRunner
from .chat.api import add_routes as add_chat_routes
from .chat.api import create_chat_completion
from .config import Settings
from .conversations.api import add_routes as add_conversation_routes
from .errors import ApiError, error_response
from .ids import new_id
from .json_out import json_response
from .models_api import add_routes as add_models_routes
from .observability.logs import AccessLog
from .observability.loop_watch import watch_the_loop
from .observability.metrics import STATS, RequestStats
from .observability.tracing import exemplar, server_span, trace_id
from .openapi import serve_openapi
from .process.lifecycle import SHUTTING_DOWN
from .responses.api import add_routes as add_responses_routes
from .responses.api import create_response
from .services import SERVICES, Services, attach, build_services, report_store
from .sse import STREAM_OPENED
from .tenants.auth import KEY_ID, LOOPBACK, LOOPBACK_KEY_HEADER, LOOPBACK_LINE_HEADER, LOOPBACK_TENANT_HEADER, TENANT
from .tenants.service_tiers import FORCED_TIER
from .tenants.tenancy import REQUEST_ID, valid_request_id
from .usage.api import add_routes as add_usage_routes
from .usage.billing import BATCH_LINE
from .usage.queues_api import add_routes as add_queue_routes

access_log = AccessLog()
QUIET_ROUTES = ("/healthz", "/readyz")  # probes: counted in the metrics, not logged every few seconds
UNTRACED_ROUTES = (*QUIET_ROUTES, "/metrics")  # nor traced, with the scrapes


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process serves requests (no dependency is checked)."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: not draining, the response store answers, and every backend can take requests."""
    services = request.app[SERVICES]
    store_problem = await services.store.health()
    store_ok = store_problem is None
    distinct = {id(b): b for b in services.backends.values()}
    backend_ready = {key: await backend.ready() for key, backend in distinct.items()}
    models = {model: "ready" if backend_ready[id(b)] else "unavailable" for model, b in services.backends.items()}
    draining = services.lifecycle.draining
    ready = store_ok and all(backend_ready.values()) and not draining
    body = {
        "status": "draining" if draining else "ready" if ready else "unavailable",
        "vocab_size": services.encoding.vocab_size,
        "store": "ok" if store_ok else store_problem,
        "models": models,
    }
    python = services.hosted.python_status()
    if python is not None:
        body["python"] = python  # offered or not, and what bounds the sandboxes' memory
    described = {model: b.describe() for model, b in services.backends.items() if hasattr(b, "describe")}
    if described:
        body["engines"] = described  # where each built-in engine runs, or why it did not load
    return json_response(body, status=200 if ready else 503)


@web.middleware
async def gateway_middleware(request: web.Request, handler):
    """Every request, in one layer (it runs for each): metrics, one access log line (metadata only) and the
    request id in the log context; an error out of the route answered in the API's shape; an API call (/v1/)
    counted as work in flight, refused with a 503 while the gateway drains, and given its tenant by its key."""
    services = request.app[SERVICES]
    metrics = services.metrics
    started = time.perf_counter()
    stats = request[STATS] = RequestStats()
    given = valid_request_id(request.headers.get("X-Request-ID", ""))
    response: web.StreamResponse | None = None
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    with server_span(request.method, route, request.headers, traced=route not in UNTRACED_ROUTES) as span:
        # the request id in the log context until the request ends: the connection's next request runs in this task
        bound = structlog.contextvars.bind_contextvars(request_id=given)
        try:
            try:
                if request.path.startswith("/v1/"):
                    response = await _api_call(request, handler, services)
                else:
                    response = await handler(request)
            except Exception as exc:
                response = error_response(request, exc)
            return response
        finally:
            structlog.contextvars.reset_contextvars(**bound)
            seconds = time.perf_counter() - started
            status = response.status if response is not None else 500
            if span.is_recording():
                span.set_attributes({"http.response.status_code": status, "gateway.tenant": request.get(TENANT) or ""})
            request_id = request.get(REQUEST_ID) or given or new_id("req_")
            if response is not None and not response.prepared:
                response.headers.setdefault("X-Request-ID", request_id)  # every route, errors included
                if services.lifecycle.draining:
                    response.force_close()  # "Connection: close": the next request goes to another replica
            tenant = request.get(TENANT)
            metrics.child(metrics.requests, route, str(status), metrics.tenant_label(tenant)).inc()
            metrics.child(metrics.request_seconds, route).observe(seconds, exemplar(span))
            if request.get(STREAM_OPENED):
                metrics.active_streams.dec()
            if route not in QUIET_ROUTES:
                _log_access(request, route, status, seconds, request_id, stats)


async def _api_call(request: web.Request, handler, services: Services) -> web.StreamResponse:
    """An API request: work in flight while it runs (refused while draining), its tenant from its API key (or a
    401) and its body within the key's limit before the route runs."""
    lifecycle = services.lifecycle
    if lifecycle.draining:
        raise ApiError(
            503,
            "The gateway is shutting down; retry the request.",
            code=SHUTTING_DOWN,
            kind="server_error",
            headers={"Retry-After": "1"},
        )
    lifecycle.enter()
    line = BATCH_LINE.set(None)
    try:
        if request.app.get(LOOPBACK):  # a batch's line, sent by this process's runner over its private socket
            tenant, key_id = request.headers[LOOPBACK_TENANT_HEADER], request.headers.get(LOOPBACK_KEY_HEADER, "")
            request[FORCED_TIER] = "flex"
            BATCH_LINE.set(request.headers.get(LOOPBACK_LINE_HEADER) or None)  # billed once per line
        else:
            tenant, key_id = await services.auth.caller(request.headers.get("Authorization"))
        request[TENANT] = tenant
        request[KEY_ID] = key_id
        structlog.contextvars.bind_contextvars(tenant=tenant)
        cap = services.settings.limits.for_tenant(tenant).max_body_bytes
        if cap is not None and (request.content_length or 0) > cap:
            raise ApiError(413, f"The request body is over this API key's limit of {cap} bytes.", code="body_too_large")
        return await handler(request)
    finally:
        BATCH_LINE.reset(line)
        lifecycle.leave()


def _log_access(
    request: web.Request, route: str, status: int, seconds: float, request_id: str, stats: RequestStats
) -> None:
    access_log.info(
        "request",
        request_id=request_id,
        method=request.method,
        route=route,
        status=status,
        tenant=request.get(TENANT),
        duration_ms=round(seconds * 1000, 2),
        input_tokens=stats.input_tokens,
        cached_tokens=stats.cached_tokens,
        output_tokens=stats.output_tokens,
        reasoning_tokens=stats.reasoning_tokens,
        **({"trace_id": traced} if (traced := trace_id()) else {}),
    )


async def serve_metrics(request: web.Request) -> web.Response:
    """Prometheus's text format, or OpenMetrics (with the latency histograms' trace exemplars) when asked."""
    registry = request.app[SERVICES].metrics.registry
    if "application/openmetrics-text" in request.headers.get("Accept", ""):
        return web.Response(
            body=openmetrics.generate_latest(registry), headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST}
        )
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _metrics_listener(settings: Settings, services: Services):
    """An on_startup/on_cleanup pair serving /metrics on its own port, away from the public API."""
    runner: web.AppRunner | None = None

    async def start(app: web.Application) -> None:
        nonlocal runner
        scrape = web.Application()
        scrape[SERVICES] = services
        scrape.router.add_get("/metrics", serve_metrics)
        runner = web.AppRunner(scrape, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, settings.host, settings.metrics_port).start()

    async def stop(app: web.Application) -> None:
        if runner is not None:
            await runner.cleanup()

    return start, stop


def _run_batches(app: web.Application, services: Services) -> None:
    """The batch runner and its loopback to this app's handlers, started and stopped with the app."""
    loopback = Loopback(
        services, gateway_middleware, {"/v1/responses": create_response, "/v1/chat/completions": create_chat_completion}
    )
    runner = BatchRunner(services, loopback)

    async def start(app: web.Application) -> None:
        await loopback.start()
        runner.start()

    async def stop(app: web.Application) -> None:
        await runner.stop()
        await loopback.stop()

    app.on_startup.append(start)
    app.on_cleanup.insert(0, stop)


def create_app(settings: Settings, services: Services | None = None, warm_checkers: bool = False) -> web.Application:
    """`services` lets tests inject a backend or store; by default they come from the settings. `warm_checkers`:
    start a request checker with the app (`serve` does), so the first large body does not wait for one."""
    # bodies are inflated by read_json, bounded and off the loop (aiohttp would inflate them on it, unbounded in time)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[gateway_middleware],
        handler_args={"auto_decompress": False},
    )
    if services is None:  # the model's own header layout in the history: prompts repeat its tokens
        services = build_services(
            settings, Renderer(load_harmony_encoding(settings.vocab_path), recipient_in_channel=True)
        )
    attach(app, services)
    if settings.metrics_public:
        app.router.add_get("/metrics", serve_metrics)
    if settings.metrics_port is not None:
        start, stop = _metrics_listener(settings, app[SERVICES])
        app.on_startup.append(start)
        app.on_cleanup.append(stop)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", serve_openapi)
    add_responses_routes(app)
    add_chat_routes(app)
    add_conversation_routes(app)
    add_models_routes(app)
    add_usage_routes(app)
    add_queue_routes(app)
    add_file_routes(app)
    add_batch_routes(app)
    _run_batches(app, services)

    async def close_services(app: web.Application) -> None:
        await app[SERVICES].aclose()

    async def check_store(app: web.Application) -> None:
        await report_store(app[SERVICES])

    async def probe_hosted_tools(app: web.Application) -> None:
        await app[SERVICES].hosted.start()

    async def start_a_checker(app: web.Application) -> None:
        if warm_checkers and app[SERVICES].costly.checkers is not None:
            app[SERVICES].costly.checkers.warm()

    app.on_startup.append(check_store)
    app.on_startup.append(probe_hosted_tools)
    app.on_startup.append(start_a_checker)
    watch_the_loop(app, services.metrics)

    app.on_cleanup.append(close_services)
    return app
