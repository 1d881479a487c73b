"""OpenTelemetry traces, off unless configured: `OTEL_TRACES_EXPORTER=otlp` or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SDK_DISABLED=true` turning it off.
The official SDK reads the other standard variables itself: `OTEL_SERVICE_NAME` (default gpt-oss-gateway),
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `_ARG` (default: the parent's decision, else always),
`OTEL_EXPORTER_OTLP_*` (headers, timeout, certificates); OTLP over HTTP (protobuf).

Spans leave through a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048) drained by one thread in batches of
`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512) every `OTEL_BSP_SCHEDULE_DELAY` ms (1,000): a collector that is slow or
gone costs requests nothing, the spans that do not fit are dropped and counted in
`gateway_trace_spans_dropped_total`. Span attributes follow the GenAI semantic conventions (model, token
counts, response id, finish reason) plus the tenant; never a prompt, an output, a chain of thought or tool
arguments.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import Span

from backends.base import GenerateRequest

from .trace_roots import (
    DecidedTraceIds,
    DroppedRoot,
    dropped_root,
    kept,
    new_trace_id,
    sampler_from_env,
    w3c_only,
)

log = structlog.get_logger("gateway.observability.tracing")

SERVICE = "gpt-oss-gateway"
_on = False  # set by configure_tracing: with tracing off, requests skip the propagation work too
P = ParamSpec("P")
T = TypeVar("T")
tracer = trace.get_tracer("gpt-oss-gateway")
# whether the request being served is in a kept trace: one context variable read tells the many requests the
# sampler leaves out that they have no spans to make, without OpenTelemetry's context lookups
_kept: ContextVar[bool] = ContextVar("gateway_trace_kept", default=False)
_NO_PARENT = otel_context.Context()
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)  # re-entrant: one for every request that is not traced
_NOTHING = contextlib.nullcontext()


def tracing_wanted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").lower()
    if exporter in ("none", "console"):
        return False
    return exporter == "otlp" or any(
        env.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


_ids = DecidedTraceIds()
_sampler: Sampler | None = None  # the provider's, set by configure_tracing
_root_bound: int | None = None  # a new trace is kept when its id's low 64 bits are under it (a standard sampler)
_direct_traceparent = True  # the default propagators: a dropped root's `traceparent` written directly


class BoundedExport(SpanProcessor):
    """Ended spans into a bounded queue (a full queue drops them, counted), exported by one thread in batches."""

    def __init__(
        self, exporter: SpanExporter, on_drop: Callable[[int], None], capacity: int, batch: int, delay_s: float
    ) -> None:
        self._exporter = exporter
        self._on_drop = on_drop
        self._queue: queue.Queue[ReadableSpan | None] = queue.Queue(capacity)
        self._batch = batch
        self._delay_s = delay_s
        self._thread = threading.Thread(target=self._run, name="otel-export", daemon=True)
        self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        try:
            self._queue.put_nowait(span)
        except queue.Full:
            self._on_drop(1)

    def _run(self) -> None:
        """Batches: the spans that came within `delay_s` of the first one, up to `batch` (one export each)."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            spans = [first]
            deadline = time.monotonic() + self._delay_s
            while len(spans) < self._batch:
                try:
                    span = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if span is None:
                    self._export(spans)
                    return
                spans.append(span)
            self._export(spans)

    def _export(self, spans: list[ReadableSpan]) -> None:
        try:
            self._exporter.export(spans)
        except Exception as exc:  # a collector's failure never reaches a request
            log.warning("trace_export_failed", error=type(exc).__name__, spans=len(spans))

    def shutdown(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=1)
        self._thread.join(timeout=5)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def configure_tracing(on_drop: Callable[[int], None]) -> TracerProvider | None:
    """The process's tracer provider when the environment asks for traces (see the module docstring), else None."""
    if not tracing_wanted():
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE)})
    sampler, bound = sampler_from_env()
    provider = TracerProvider(sampler=sampler, resource=resource, id_generator=_ids)
    processor = BoundedExport(
        OTLPSpanExporter(),
        on_drop,
        int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048")),
        int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512")),
        int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "1000")) / 1000,
    )
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    global _on, tracer, _sampler, _root_bound, _direct_traceparent
    _on = True
    _sampler, _root_bound, _direct_traceparent = provider.sampler, bound, w3c_only()
    tracer = provider.get_tracer("gpt-oss-gateway")  # the SDK's own: no proxy between on every span
    log.info("tracing_on", exporter="otlp")
    return provider


def _in_kept_trace() -> bool:
    """Whether the current span records: asked of OpenTelemetry only inside a request whose trace is kept."""
    return _kept.get() and trace.get_current_span().is_recording()


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits), for the access log; None outside a sampled trace."""
    if not _kept.get():
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid and context.trace_flags.sampled else None


def generation_span(model: str, request: GenerateRequest) -> Span:
    """A span for one generation on a backend (a child of the current one), its trace context put in the request
    for the backend to carry on (remote backends send it as headers). In a trace that is not kept, no span: the
    current context goes on as it is (its `traceparent` says not to keep it)."""
    if not _on:
        return trace.INVALID_SPAN
    if not _in_kept_trace():
        request.trace_context.clear()
        if (dropped := dropped_root()) is not None:
            dropped.carry(request.trace_context, _direct_traceparent)
        else:
            inject(request.trace_context)
        return trace.INVALID_SPAN
    span = tracer.start_span(
        f"chat {model}".strip(),
        kind=trace.SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "gpt-oss",
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": request.max_new_tokens,
        },
    )
    if span.get_span_context().is_valid:
        request.trace_context.clear()
        inject(request.trace_context, context=trace.set_span_in_context(span))
    return span


def end_generation_span(span: Span, turn: Any) -> None:
    """The generation's token counts and how it ended, on its span, which ends."""
    if not span.is_recording():
        return
    outcome = turn.outcome
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": turn.prompt_tokens,
            "gen_ai.usage.output_tokens": turn.output_tokens,
            "gateway.cached_tokens": turn.cached_tokens,
            "gen_ai.response.finish_reasons": [outcome.status if outcome is not None else "cancelled"],
        }
    )
    if outcome is not None and outcome.status == "failed":
        span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error_code or "failed"))
    span.end()


def server_span(
    method: str, route: str, headers: Mapping[str, str], traced: bool = True
) -> contextlib.AbstractContextManager[Span]:
    """The request's span: a child of the caller's (a W3C `traceparent` in `headers`), else a new trace; none
    (a span that records nothing) with tracing off and for routes not `traced` (probes, scrapes). A new trace
    the sampler leaves out gets its ids and a span that records nothing, no SDK span: the decision is taken
    first, on the trace id the span would get (see trace_roots)."""
    if not (traced and _on):
        return _NO_SPAN
    assert _sampler is not None
    name = f"{method} {route}"
    attributes = {"http.request.method": method, "http.route": route}
    if "traceparent" in headers or "baggage" in headers:
        caller = extract(headers)
    else:
        caller = _NO_PARENT
        trace_id = new_trace_id()
        if _root_bound is None:  # a sampler the SDK read: asked, as it would be
            sampling = _sampler.should_sample(caller, trace_id, name, trace.SpanKind.SERVER, attributes)
            if not sampling.decision.is_recording():
                return DroppedRoot(trace_id, sampling.trace_state)
        elif not kept(trace_id, _root_bound):
            return DroppedRoot(trace_id)
        _ids.decided(trace_id)
    try:
        span = tracer.start_span(name, context=caller, kind=trace.SpanKind.SERVER, attributes=attributes)
    finally:
        _ids.decided(None)  # taken by the span, or by nothing (a later root must not get it)
    return _Current(span)


class _Current:
    """A span made current for a `with` block, then ended (a class, not a generator: every request enters one)."""

    __slots__ = ("_kept", "_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._kept = _kept.set(self._span.is_recording())
        return self._span

    def __exit__(self, *_: object) -> None:
        _kept.reset(self._kept)
        otel_context.detach(self._token)
        self._span.end()


def exemplar(span: Span) -> dict[str, str] | None:
    """A histogram observation's exemplar: the trace it was made in (OpenMetrics), when one is sampled."""
    if not _on:
        return None
    context = span.get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return {"trace_id": format(context.trace_id, "032x")}


def traced(name: str) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """An async function's calls as spans named `name`, children of the current one (in kept traces)."""

    def wrap(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        def inner(*args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
            call = function(*args, **kwargs)
            if _in_kept_trace():
                return _in_span(name, call)
            return call  # no span to make (tracing off, or a trace not kept): the call itself, no layer between

        return inner

    return wrap


async def _in_span(name: str, call: Awaitable[T]) -> T:
    with tracer.start_as_current_span(name):
        return await call


def child_span(name: str, attributes: dict[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span under the current one, or nothing outside a kept trace: no trace of its own for work no request
    asked for (a probe's store check, a background retry), and no cost for the requests the sampler leaves out."""
    if not _in_kept_trace():
        return _NOTHING
    return tracer.start_as_current_span(name, attributes=attributes)
