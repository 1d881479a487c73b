"""Prometheus metrics (prefix `gateway_`), one registry per application.

Labels never carry keys, request ids or text. The tenant label is bounded: the tenants listed in
GATEWAY_METRICS_TENANTS, or else the first `MAX_TENANT_LABELS` tenants seen; every other tenant is
counted as `other`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.base import Backend, EngineStats, ReportsEngineStats, ReportsRouting

MAX_TENANT_LABELS = 20
OTHER = "other"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5)
_STORE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5)


@dataclass(slots=True)
class RequestStats:
    """Token counts of one HTTP request (all its generations), for its access log line."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


STATS = web.RequestKey("stats", RequestStats)  # where the app's middleware keeps a request's token counts


LOOP_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STORE_OPERATIONS = ("save", "renew", "load", "delete", "index_tool_calls", "find_cot", "health")


class Metrics:
    def __init__(self, tenant_allow_list: list[str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._allowed = set(tenant_allow_list or [])
        self._seen: set[str] = set()
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "HTTP requests by route, status and tenant", ["route", "status", "tenant"], registry=r
        )
        self.request_seconds = Histogram(
            "gateway_request_duration_seconds", "End-to-end request time (a stream: until it ends)", ["route"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds", "From admission to the first generated token", ["model"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.ttfct = Histogram(
            "gateway_time_to_first_content_token_seconds",
            "From admission to the first token of answer text or a tool call (after any reasoning)", ["model"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.inter_token = Histogram(
            "gateway_inter_token_latency_seconds",
            "Time between generated tokens (the mean gap of each 16 tokens)",
            ["model"],
            buckets=_TOKEN_GAP, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "gateway_tokens", "Tokens by type: input, cached, output, reasoning", ["type", "model", "tenant"],
            registry=r,
        )  # fmt: skip
        self.active_streams = Gauge("gateway_active_streams", "SSE streams open to clients", registry=r)
        self.websockets = Gauge("gateway_websockets_open", "Responses WebSockets open to clients", registry=r)
        self.websocket_responses = Counter(
            "gateway_websocket_responses",
            "Responses created over WebSockets, by final status (refused: an error event) and tenant",
            ["status", "tenant"],
            registry=r,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused by a limit", ["limit", "tenant"], registry=r
        )
        self.trace_spans_dropped = Counter(
            "gateway_trace_spans_dropped", "Trace spans dropped: the export queue was full", registry=r
        )
        self.usage_records = Counter(
            "gateway_usage_records",
            "Usage ledger writes: kept, already kept (a retry), failed (retried in the background), given up",
            ["outcome"],
            registry=r,
        )
        self.generation_seconds = Histogram(
            "gateway_backend_generation_seconds", "One generation on a backend, start to end", ["model"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.backend_errors = Counter(
            "gateway_backend_errors", "Generations that failed in the backend", ["model"], registry=r
        )
        self.store_seconds = Histogram(
            "gateway_store_operation_duration_seconds", "Response store operations", ["operation"],
            buckets=_STORE, registry=r,
        )  # fmt: skip
        self.store_errors = Counter(
            "gateway_store_errors", "Response store operations that failed", ["operation"], registry=r
        )
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled every 10 ms): a stall anywhere shows here",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_descheduled = Histogram(
            "gateway_event_loop_lag_descheduled_seconds",
            "Of the event loop's lags, those the host caused: its thread waited for a CPU most of the late time",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )

    def start_at_zero(self, models: list[str]) -> None:
        """Error counters exist from the start at 0, so rates and alerts on them have series before any error."""
        for model in models:
            self.backend_errors.labels(model)
        for operation in STORE_OPERATIONS:
            self.store_errors.labels(operation)

    def watch_engines(self, backends: dict[str, Backend]) -> None:
        """Export `gateway_engine_*` for the named backends that run a model in-process, and
        `gateway_routing_*` / `gateway_upstream_*` for those that route among servers."""
        engines = {name: b for name, b in backends.items() if isinstance(b, ReportsEngineStats)}
        if engines:
            self.registry.register(EngineCollector(engines, self.tenant_label))
        routers = {name: b for name, b in backends.items() if isinstance(b, ReportsRouting)}
        if routers:
            self.registry.register(RoutingCollector(routers))

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, looked up in a dict after the first time (several per request; the
        label sets are bounded: routes, statuses, models, tenant labels)."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*values)
            if len(self._children) < MAX_CACHED_CHILDREN:
                self._children[key] = found
        return found

    def tenant_label(self, tenant: str | None) -> str:
        if tenant is None:
            return "none"
        if self._allowed:
            return tenant if tenant in self._allowed else OTHER
        if tenant in self._seen:
            return tenant
        if len(self._seen) < MAX_TENANT_LABELS:
            self._seen.add(tenant)
            return tenant
        return OTHER

    def turn_observer(self, model: str, tenant: str, stats: RequestStats | None) -> TurnObserver:
        return TurnObserver(
            self, model, self.tenant_label(tenant), stats or RequestStats(), self.child(self.inter_token, model)
        )


INTER_TOKEN_WINDOW = 16
MAX_CACHED_CHILDREN = 8192


@dataclass(slots=True)
class TurnObserver:
    """Timings and token counts of one generation, reported by its Turn."""

    metrics: Metrics
    model: str
    tenant: str
    stats: RequestStats
    inter_token: Histogram  # this model's child, looked up once per generation rather than per token
    started: float = field(default_factory=time.monotonic)
    last_token: float | None = None  # when the current window of tokens began
    window_tokens: int = 0
    content_seen: bool = False

    def tokens(self, count: int, content: bool) -> None:
        """Per chunk; the inter-token histogram gets the mean gap of each INTER_TOKEN_WINDOW tokens (and of
        the rest at the end): one observation, with its lock, per window instead of per token. `content`:
        the chunk holds answer text or a call, which stops the time to first content token the first time.
        The clock is read only when something is observed."""
        if self.last_token is None:
            now = time.monotonic()
            self.metrics.child(self.metrics.ttft, self.model).observe(now - self.started)
            self.last_token = now
        else:
            self.window_tokens += count
            if self.window_tokens >= INTER_TOKEN_WINDOW:
                self._observe_window(time.monotonic())
        if content and not self.content_seen:
            self.content_seen = True
            self.metrics.child(self.metrics.ttfct, self.model).observe(time.monotonic() - self.started)

    def _observe_window(self, now: float) -> None:
        assert self.last_token is not None
        self.inter_token.observe((now - self.last_token) / self.window_tokens)
        self.last_token, self.window_tokens = now, 0

    def finished(self, failed: bool, prompt: int, cached: int, output: int, reasoning: int) -> None:
        if self.window_tokens:
            self._observe_window(time.monotonic())
        metrics, model, tenant = self.metrics, self.model, self.tenant
        child = metrics.child
        child(metrics.generation_seconds, model).observe(time.monotonic() - self.started)
        if failed:
            metrics.backend_errors.labels(model).inc()
        for kind, count in (("input", prompt), ("cached", cached), ("output", output), ("reasoning", reasoning)):
            counter = child(metrics.tokens, kind, model, tenant)  # the series exists from the first request
            if count:  # adding 0 would only take the counter's lock
                counter.inc(count)
        stats = self.stats
        stats.input_tokens += prompt
        stats.cached_tokens += cached
        stats.output_tokens += output
        stats.reasoning_tokens += reasoning


class EngineCollector(Collector):
    """In-process engines' load, read at scrape time; the `backend` label is the configured backend name."""

    def __init__(
        self, engines: dict[str, ReportsEngineStats], tenant_label: Callable[[str], str] = lambda tenant: tenant
    ) -> None:
        """`tenant_label`: the `tenant` label a tenant's queue figures get (the bounded set the gateway uses)."""
        self._engines = engines
        self._tenant_label = tenant_label

    def collect(self) -> Iterator[Metric]:
        sequences = GaugeMetricFamily(
            "gateway_engine_sequences",
            "Sequences running (holding KV pages) or waiting for pages or room in the batch",
            labels=["backend", "state"],
        )
        batch = GaugeMetricFamily("gateway_engine_max_batch", "Sequences run at once, at most", labels=["backend"])
        kv = GaugeMetricFamily(
            "gateway_engine_kv_tokens", "KV positions: written by running sequences, and the full-attention pool's",
            labels=["backend", "state"],
        )  # fmt: skip
        pages = GaugeMetricFamily(
            "gateway_engine_kv_pages", "KV pages per pool: held by sequences, kept by the prefix cache only, free",
            labels=["backend", "pool", "state"],
        )  # fmt: skip
        preemptions = CounterMetricFamily(
            "gateway_engine_preemptions", "Sequences preempted for KV pages (run again later)", labels=["backend"]
        )
        steps = CounterMetricFamily("gateway_engine_decode_steps", "Decode steps run", labels=["backend"])
        tokens = CounterMetricFamily(
            "gateway_engine_tokens", "Tokens run: prompt tokens prefilled, tokens decoded", labels=["backend", "phase"]
        )
        prompt = CounterMetricFamily(
            "gateway_engine_prefix_tokens",
            "Prompt tokens of started sequences: all looked up, and those reused from the prefix cache (hit ratio)",
            labels=["backend", "outcome"],
        )
        blocks = GaugeMetricFamily(
            "gateway_engine_prefix_blocks", "KV pages the prefix cache names", labels=["backend"]
        )
        evicted = CounterMetricFamily(
            "gateway_engine_prefix_evicted_blocks",
            "Named KV pages taken back, for other sequences or the prefix cache's budget",
            labels=["backend"],
        )
        queued = GaugeMetricFamily(
            "gateway_engine_tenant_sequences",
            "Sequences running or waiting, by tenant and service tier (the fair share's queues)",
            labels=["backend", "tenant", "tier", "state"],
        )
        admitted = CounterMetricFamily(
            "gateway_engine_tenant_admitted",
            "Sequences admitted, by tenant and tier",
            labels=["backend", "tenant", "tier"],
        )
        waited = CounterMetricFamily(
            "gateway_engine_tenant_wait_seconds",
            "Time admitted sequences waited from arrival to admission, summed, by tenant and tier",
            labels=["backend", "tenant", "tier"],
        )
        for name, engine in self._engines.items():
            stats = engine.engine_stats()
            if stats is None:
                continue
            self._add_queues(name, stats, queued, admitted, waited)
            sequences.add_metric([name, "running"], stats.running)
            sequences.add_metric([name, "waiting"], stats.waiting)
            batch.add_metric([name], stats.max_batch)
            for pool, counts in stats.kv_pages.items():
                for state in ("in_use", "cached", "free"):
                    pages.add_metric([name, pool, state], getattr(counts, state))
            preemptions.add_metric([name], stats.preemptions)
            kv.add_metric([name, "used"], stats.kv_tokens)
            kv.add_metric([name, "capacity"], stats.kv_capacity_tokens)
            steps.add_metric([name], stats.decode_steps)
            tokens.add_metric([name, "prefill"], stats.prefill_tokens)
            tokens.add_metric([name, "decode"], stats.decode_tokens)
            prompt.add_metric([name, "lookup"], stats.prefix_lookup_tokens)
            prompt.add_metric([name, "hit"], stats.prefix_hit_tokens)
            blocks.add_metric([name], stats.prefix_blocks)
            evicted.add_metric([name], stats.prefix_evicted_blocks)
        yield from (sequences, batch, kv, pages, preemptions, steps, tokens, prompt, blocks, evicted)
        yield from (queued, admitted, waited)

    def _add_queues(self, name: str, stats: EngineStats, queued: Metric, admitted: Metric, waited: Metric) -> None:
        """Each tenant's queues under its label (tenants without a label of their own summed as `other`)."""
        merged: dict[tuple[str, str], list[float]] = {}
        for (tenant, tier), queue in stats.queues.items():
            figures = merged.setdefault((self._tenant_label(tenant), tier), [0, 0, 0, 0.0])
            for index, value in enumerate((queue.running, queue.waiting, queue.admitted, queue.wait_seconds)):
                figures[index] += value
        for (tenant, tier), (running, waiting, count, seconds) in merged.items():
            queued.add_metric([name, tenant, tier, "running"], running)
            queued.add_metric([name, tenant, tier, "waiting"], waiting)
            admitted.add_metric([name, tenant, tier], count)
            waited.add_metric([name, tenant, tier], seconds)


class RoutingCollector(Collector):
    """How remote backends chose their servers, and what they know of each (the `upstream` label: its URL)."""

    def __init__(self, routers: dict[str, ReportsRouting]) -> None:
        self._routers = routers

    def collect(self) -> Iterator[Metric]:
        routed = CounterMetricFamily(
            "gateway_routing_decisions",
            "Generations by how their server was chosen: the prefix it held, its load, the prompt_cache_key",
            labels=["backend", "how"],
        )
        tokens = CounterMetricFamily(
            "gateway_routing_prompt_tokens",
            "Prompt tokens routed, and those the chosen server held (its events, or what was routed there)",
            labels=["backend", "outcome"],
        )
        load = GaugeMetricFamily(
            "gateway_upstream_load", "Requests running and waiting on a server, as the router sees them",
            labels=["backend", "upstream"],
        )  # fmt: skip
        queued = GaugeMetricFamily(
            "gateway_upstream_queued_prompt_tokens",
            "Prompt tokens to run on a server before their first tokens, as the router sees them",
            labels=["backend", "upstream"],
        )
        pages = GaugeMetricFamily(
            "gateway_upstream_prefix_pages",
            "Pages a server holds: as it publishes them, and as remembered from what was routed there",
            labels=["backend", "upstream", "source"],
        )
        warmups = CounterMetricFamily(
            "gateway_routing_prefix_warmups",
            "Hot shared prefixes sent ahead to a lighter server that did not hold them (one token asked, flex tier)",
            labels=["backend"],
        )
        in_sync = GaugeMetricFamily(
            "gateway_upstream_page_events_in_sync",
            "1 while a server's page events are followed (0: routing to it falls back to what was routed there)",
            labels=["backend", "upstream"],
        )
        for name, backend in self._routers.items():
            report = backend.routing_stats()
            if report is None:
                continue
            for how, count in report.routed.items():
                routed.add_metric([name, how], count)
            tokens.add_metric([name, "all"], report.prompt_tokens)
            tokens.add_metric([name, "matched"], report.matched_tokens)
            warmups.add_metric([name], report.warmups)
            for url, server in report.servers.items():
                load.add_metric([name, url], server.load)
                queued.add_metric([name, url], server.queued_tokens)
                pages.add_metric([name, url, "routed"], server.routed_pages)
                if server.events_in_sync is not None:
                    pages.add_metric([name, url, "published"], server.published_pages)
                    in_sync.add_metric([name, url], 1 if server.events_in_sync else 0)
        yield from (routed, tokens, warmups, load, queued, pages, in_sync)
