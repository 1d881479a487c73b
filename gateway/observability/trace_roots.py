"""New traces, decided before any span is made: the sampler that `OTEL_TRACES_SAMPLER` / `_ARG` name (built here as
the SDK builds it, so the decision rule of its root is known), and the trace context of a request the sampler
leaves out, which carries on to the backends with no SDK span behind it. Most requests of a sampled
deployment are such requests: they cost a random draw, a comparison and a span that records nothing."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping
from contextvars import ContextVar

import structlog
from opentelemetry import context, trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags, TraceState

log = structlog.get_logger("gateway.observability.tracing")

_LOW_64 = (1 << 64) - 1
_KEEP_ALL = 1 << 64  # a bound no trace id's low 64 bits reach
NOT_SAMPLED = TraceFlags(TraceFlags.RANDOM_TRACE_ID)  # as the SDK marks a dropped root whose ids are random


def sampler_from_env(environ: Mapping[str, str] | None = None) -> tuple[Sampler | None, int | None]:
    """The sampler the environment names, with the bound under which a new trace's id (its low 64 bits) is kept;
    (None, None) for a name this does not know (the SDK then reads it, and is asked about every new trace). No
    name is the SDK's default, parent-based always-on; a ratio that is not a number in [0, 1] is 1.0, as the SDK
    reads them."""
    env = os.environ if environ is None else environ
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
    base = name.removeprefix("parentbased_")
    if base == "always_on":
        root, bound = ALWAYS_ON, _KEEP_ALL
    elif base == "always_off":
        root, bound = ALWAYS_OFF, 0
    elif base == "traceidratio":
        try:
            root = TraceIdRatioBased(float(env.get("OTEL_TRACES_SAMPLER_ARG", "")))
        except ValueError:
            log.warning("trace_sampler_arg_invalid", using=1.0)
            root = TraceIdRatioBased(1.0)
        bound = root.bound
    else:
        return None, None
    return (ParentBased(root) if name.startswith("parentbased_") else root), bound


def kept(trace_id: int, bound: int) -> bool:
    """Whether the standard samplers keep a new trace with this id (TraceIdRatioBased's rule)."""
    return trace_id & _LOW_64 < bound


def new_trace_id() -> int:
    """A random trace id, as the SDK's generator draws one (never the invalid 0)."""
    while not (trace_id := random.getrandbits(128)):
        pass
    return trace_id


def w3c_only(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the propagators are the default W3C ones (trace context and baggage), which a dropped root's
    context can be written for directly: it has no baggage, so only `traceparent` carries anything."""
    env = os.environ if environ is None else environ
    names = {part.strip().lower() for part in env.get("OTEL_PROPAGATORS", "tracecontext,baggage").split(",")}
    return names <= {"tracecontext", "baggage"} and "tracecontext" in names


class DecidedTraceIds(RandomIdGenerator):
    """Random ids, except that a root span gets the trace id its sampling decision was just taken on."""

    def __init__(self) -> None:
        self._decided = threading.local()

    def decided(self, trace_id: int | None) -> None:
        """The next root span in this thread gets `trace_id` (the sampler is asked again on it, and agrees);
        None: a random one again."""
        self._decided.trace_id = trace_id

    def generate_trace_id(self) -> int:
        decided = getattr(self._decided, "trace_id", None)
        if decided is None:
            return super().generate_trace_id()
        self._decided.trace_id = None
        return decided


class DroppedRoot:
    """A new trace the sampler left out, current for a `with` block (the request) as a span that records nothing,
    as the SDK would have made it: its trace id and a span id, not sampled. A library that traces on its own (the
    MCP SDK's client) finds it current, so its spans join the request's trace, not sampled, rather than start
    traces of their own, and what it propagates names the request's trace."""

    __slots__ = ("_attached", "_span", "_token")

    def __init__(self, trace_id: int, trace_state: TraceState | None = None) -> None:
        span_id = random.getrandbits(64) or 1
        self._span = NonRecordingSpan(SpanContext(trace_id, span_id, False, NOT_SAMPLED, trace_state))

    def carry(self, carrier: dict[str, str], direct: bool) -> None:
        """The trace context, not sampled, into `carrier`: written `direct`ly as `traceparent` (the default
        propagators), else by the configured propagators."""
        ids = self._span.get_span_context()
        if direct and not ids.trace_state:
            carrier["traceparent"] = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{NOT_SAMPLED:02x}"
            return
        inject(carrier, context=trace.set_span_in_context(self._span))

    def __enter__(self) -> Span:
        self._token = _current.set(self)
        self._attached = context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, *_: object) -> None:
        context.detach(self._attached)
        _current.reset(self._token)


# beside the span in OpenTelemetry's context: it says the context is one of ours with no baggage (an unsampled
# caller's may carry some), so generation_span may write its `traceparent` without the propagators
_current: ContextVar[DroppedRoot | None] = ContextVar("gateway_dropped_root", default=None)


def dropped_root() -> DroppedRoot | None:
    """The request's new trace if the sampler left it out."""
    return _current.get()
