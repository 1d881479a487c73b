"""The engine server: the built-in engine alone, behind the token protocol (backends/engine_wire.py).

Routes: POST /v1/engine/generate (a generation as SSE), GET /v1/engine/kv_events (the pages its prefix cache
names, as SSE: a snapshot, then the events in order, and its running and waiting requests as they change),
GET /v1/engine/info, GET /health and /readyz (200 once the model is loaded, 503 while loading, failed or
draining), GET /livez (the process answers), GET /metrics (Prometheus: the load and KV use under vLLM's names,
which the Kubernetes Gateway API Inference Extension reads, beside the engine's own). Nothing of the public API:
the gateway's API replicas speak to it with the `engine` backend kind. With an API key set, every route but
/livez, /health, /readyz and /metrics asks for it as a Bearer token.

A client that goes away cancels its generation: the sequence leaves the batch before the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from backends.base import BackendError, Chunk
from backends.engine_wire import (
    EVENTS_PATH,
    FINISHED_EVENT,
    GENERATE_PATH,
    INFO_PATH,
    WireRequest,
    chunk_event,
    error_object,
)

from .backend import EngineBackend
from .page_events import STORED, PageEvents

log = structlog.get_logger("backends.engine.server")

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
EVENTS_POLL_S = 0.02  # how often a kv_events stream looks for new events
EVENTS_HEARTBEAT_S = 5.0  # an idle kv_events stream says it is alive (and its load) this often
MAX_EVENT_STREAMS = 64
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Lifecycle(Protocol):
    """The process's lifecycle as the handlers see it: whether it drains, and each request in flight."""

    draining: bool

    def enter(self) -> None: ...

    def leave(self) -> None: ...


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(error_object(message, kind), status=status)


def _sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class EngineServer:
    def __init__(self, engine: EngineBackend, api_key: str | None, lifecycle: Lifecycle, max_body_bytes: int) -> None:
        self.engine = engine
        self.lifecycle = lifecycle
        self._api_key = api_key.encode() if api_key else None
        self._max_body_bytes = max_body_bytes
        self._event_streams = 0

    def app(self, registry: CollectorRegistry) -> web.Application:
        app = web.Application(client_max_size=self._max_body_bytes, middlewares=[self._auth])
        registry.register(InferenceGatewayMetrics(self.engine))
        metrics = MetricsRoute(registry)
        app.router.add_post(GENERATE_PATH, self.generate)
        app.router.add_get(EVENTS_PATH, self.kv_events)
        app.router.add_get(INFO_PATH, self.info)
        app.router.add_get("/health", self.health)
        app.router.add_get("/readyz", self.health)
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/metrics", metrics.handle)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if self._api_key is None or request.path in ("/livez", "/health", "/readyz", "/metrics"):
            return await handler(request)
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(given, self._api_key):
            return _error(401, "A valid engine API key is required (Authorization: Bearer ...).", "unauthorized")
        return await handler(request)

    def _unavailable(self) -> web.Response | None:
        """The 503 that sends a client to another server, when this one cannot take work now."""
        if self.lifecycle.draining:
            return _error(503, "The engine server is draining.", "draining")
        described = self.engine.describe()
        if described["status"] == "failed":
            return _error(503, f"The model could not be loaded: {described['error']}", "not_ready")
        if described["status"] == "stopped":
            return _error(503, f"The model is unavailable: {described['error']}", "not_ready")
        if described["status"] != "ready":
            return _error(503, "The model is loading.", "not_ready")
        return None

    async def generate(self, request: web.Request) -> web.StreamResponse:
        refused = self._unavailable()
        if refused is not None:
            return refused
        try:
            wire = WireRequest.model_validate_json(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"The request body exceeds {self._max_body_bytes} bytes.", "invalid_request")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}" for error in exc.errors()
            )
            return _error(400, f"Invalid generation request: {problems[:1000]}", "invalid_request")
        context = self.engine.capabilities.context_length
        if len(wire.prompt) >= context:
            message = f"The prompt ({len(wire.prompt)} tokens) exceeds the model's context ({context} tokens)."
            return _error(400, message, "invalid_request")
        trace_context = {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        generation = wire.generate_request(trace_context)
        response = web.StreamResponse(headers=SSE_HEADERS)
        self.lifecycle.enter()
        try:
            await response.prepare(request)
            await self._stream(response, self.engine.generate(generation))
        except (ConnectionResetError, asyncio.CancelledError):
            log.info("engine_generation_abandoned", request_id=wire.request_id)
            raise
        finally:
            self.lifecycle.leave()
        return response

    async def _stream(self, response: web.StreamResponse, chunks: AsyncIterator[Chunk]) -> None:
        first = True
        try:
            async with aclosing(chunks) as generation:
                async for chunk in generation:
                    await response.write(_sse(chunk_event(chunk, chunk.cached_tokens if first else None)))
                    first = False
        except BackendError as exc:
            await response.write(_sse(error_object(str(exc), "engine_error")))
            return
        except Exception as exc:  # a failure of this request only: said on its stream, the server goes on
            log.exception("engine_generation_failed")
            await response.write(_sse(error_object(f"The engine failed ({type(exc).__name__}).", "engine_error")))
            return
        await response.write(_sse(FINISHED_EVENT))

    async def kv_events(self, request: web.Request) -> web.StreamResponse:
        if self._event_streams >= MAX_EVENT_STREAMS:
            return _error(503, f"At most {MAX_EVENT_STREAMS} event streams at once.", "too_many_streams")
        response = web.StreamResponse(headers=SSE_HEADERS)
        self._event_streams += 1
        try:
            await response.prepare(request)
            await self._publish(response, self.engine.page_events)
        except ConnectionResetError:
            pass
        finally:
            self._event_streams -= 1
        return response

    async def _publish(self, response: web.StreamResponse, events: PageEvents) -> None:
        """A snapshot, then each batch of events after it (a snapshot again after falling behind), and the load
        whenever it changes (at once when a request arrives or ends here: a router on another replica sees it
        before choosing again), until the client goes or the server drains."""
        loop = asyncio.get_running_loop()
        changed = self.engine.watch_load()
        try:
            seq = await self._snapshot(response, events)
            load = self.engine.engine_load()
            quiet_since = loop.time()
            while not self.lifecycle.draining:
                changed.clear()
                now = self.engine.engine_load()
                if now != load or loop.time() - quiet_since >= EVENTS_HEARTBEAT_S:
                    load = now
                    await response.write(_sse({"instance": events.instance, "seq": seq, **load._asdict()}, "load"))
                    quiet_since = loop.time()
                batch = events.since(seq)
                if batch is None:
                    seq = await self._snapshot(response, events)
                    continue
                if batch:
                    await response.write(_sse(_batch_payload(events.instance, batch), "pages"))
                    seq = batch[-1].seq
                    quiet_since = loop.time()
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), EVENTS_POLL_S)
        finally:
            self.engine.unwatch_load(changed)

    async def _snapshot(self, response: web.StreamResponse, events: PageEvents) -> int:
        snapshot = events.snapshot()
        payload = {
            **self._identity(),
            "seq": snapshot.seq,
            "slots": self.engine.options.max_batch,
            **self.engine.engine_load()._asdict(),
            "pages": [[name.hex(), parent.hex()] for name, parent in snapshot.names.items()],
        }
        await response.write(_sse(payload, "snapshot"))
        return snapshot.seq

    def _identity(self) -> dict[str, Any]:
        options = self.engine.options
        return {
            "instance": self.engine.page_events.instance,
            "page_size": options.page_size,
            "prefix_cache_scope": options.prefix_cache_scope,
        }

    async def info(self, request: web.Request) -> web.Response:
        options = self.engine.options
        return web.json_response(
            {
                **self._identity(),
                **self.engine.describe(),
                "max_positions": options.max_positions,
                "max_batch": options.max_batch,
                "prefix_cache": self.engine.capabilities.prefix_cache,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        refused = self._unavailable()
        return refused or web.json_response({"status": "ready", **self.engine.describe()})

    async def livez(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})


def _batch_payload(instance: str, batch: list) -> dict[str, Any]:
    """Events in order: ["s", name, parent] for a page named, ["r", name] for a name dropped."""
    return {
        "instance": instance,
        "first": batch[0].seq,
        "seq": batch[-1].seq,
        "events": [
            ["s", event.name.hex(), event.parent.hex()] if event.kind == STORED else ["r", event.name.hex()]
            for event in batch
        ],
    }


class MetricsRoute:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), content_type="text/plain", charset="utf-8")


class InferenceGatewayMetrics(Collector):
    """The engine's load and KV use under the names vLLM exports, which the Kubernetes Gateway API Inference
    Extension's endpoint picker (and other routers) read by default."""

    def __init__(self, engine: EngineBackend) -> None:
        self._engine = engine

    def collect(self) -> list[Metric]:
        stats = self._engine.engine_stats()
        if stats is None:
            return []
        full = stats.kv_pages["full"]
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be scheduled")
        waiting.add_metric([], stats.waiting)
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests in the running batch")
        running.add_metric([], stats.running)
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means the pool is full")
        usage.add_metric([], full.in_use / full.pages if full.pages else 0.0)
        config = GaugeMetricFamily(
            "vllm:cache_config_info", "The KV cache's configuration", labels=["block_size", "num_gpu_blocks"]
        )
        config.add_metric([str(self._engine.options.page_size), str(full.pages)], 1)
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        queries.add_metric([], stats.prefix_lookup_tokens)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache")
        hits.add_metric([], stats.prefix_hit_tokens)
        return [waiting, running, usage, config, queries, hits]
