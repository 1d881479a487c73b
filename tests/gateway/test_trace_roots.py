"""New traces decided before any span: the sampler built from `OTEL_TRACES_SAMPLER` / `_ARG` is the one the SDK
builds from them, and the shortcut rule (a bound on the trace id's low 64 bits) decides as that sampler does;
a dropped root's trace context, written directly, is what the default propagators write for it."""

from __future__ import annotations

import random

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceState

from gateway.observability.trace_roots import NOT_SAMPLED, DroppedRoot, kept, new_trace_id, sampler_from_env, w3c_only

SETTINGS = [
    {},
    {"OTEL_TRACES_SAMPLER": "always_on"},
    {"OTEL_TRACES_SAMPLER": "always_off"},
    {"OTEL_TRACES_SAMPLER": "parentbased_always_off"},
    {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.3"},
    {"OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "lots"},
    {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
]


@pytest.mark.parametrize("environ", SETTINGS, ids=lambda e: "-".join(e.values()) or "default")
def test_the_sampler_is_the_sdk_s_and_the_bound_decides_as_it_does(environ, monkeypatch):
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    sampler, bound = sampler_from_env()
    assert sampler is not None and bound is not None
    sdk_s = TracerProvider(shutdown_on_exit=False).sampler
    assert sampler.get_description() == sdk_s.get_description()
    ids = [new_trace_id() for _ in range(3000)]
    ids += [(1 << 64) - 1, 1 << 64, 1]  # the low half's ends
    decisions = [
        sdk_s.should_sample(Context(), trace_id, "POST /v1/responses").decision.is_sampled() for trace_id in ids
    ]
    assert [kept(trace_id, bound) for trace_id in ids] == decisions


def test_a_sampler_it_does_not_know_is_left_to_the_sdk():
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "jaeger_remote"}) == (None, None)


def test_a_dropped_root_s_traceparent_is_what_the_default_propagators_write():
    trace_id = random.getrandbits(128) | 1
    root = DroppedRoot(trace_id)
    direct: dict[str, str] = {}
    root.carry(direct, direct=True)
    again: dict[str, str] = {}
    root.carry(again, direct=True)
    assert again == direct  # one span id for all of a request's generations
    span_id = int(direct["traceparent"].split("-")[2], 16)
    by_sdk: dict[str, str] = {}
    inject(
        by_sdk, context=trace.set_span_in_context(NonRecordingSpan(SpanContext(trace_id, span_id, False, NOT_SAMPLED)))
    )
    assert direct == by_sdk and direct["traceparent"].endswith("-02")  # random ids, not sampled
    stated = DroppedRoot(trace_id, TraceState([("vendor", "x")]))
    carried: dict[str, str] = {}
    stated.carry(carried, direct=True)  # a trace state goes through the propagators
    assert carried["tracestate"] == "vendor=x" and carried["traceparent"].split("-")[1] == f"{trace_id:032x}"


@pytest.mark.parametrize(
    ("propagators", "direct"),
    [(None, True), ("tracecontext", True), ("baggage, tracecontext", True), ("b3", False), ("tracecontext,b3", False)],
)
def test_only_the_w3c_propagators_are_written_directly(propagators, direct):
    assert w3c_only({} if propagators is None else {"OTEL_PROPAGATORS": propagators}) is direct


def test_a_sampler_the_sdk_reads_is_asked_about_each_new_trace_on_the_id_its_span_gets(monkeypatch):
    """A sampler this does not build (here one passed in, as for a name the SDK reads): `server_span` asks it
    about each new trace; a kept request's span is exported under the trace id the decision was taken on, a
    dropped one makes no span and tells the backend its trace id, not sampled, and a library's own span under
    it joins that trace unsampled (no trace of its own); about half of each at 0.5."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from backends.base import GenerateRequest
    from gateway.observability import tracing

    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(0.5)), id_generator=tracing._ids, shutdown_on_exit=False
    )
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    for name, value in (("_on", True), ("_sampler", provider.sampler), ("_root_bound", None)):
        monkeypatch.setattr(tracing, name, value)
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("test"))
    library = provider.get_tracer("a library that traces on its own")  # as the MCP SDK's client does
    dropped = []
    for _ in range(200):
        with tracing.server_span("POST", "/v1/responses", {}) as span:
            if not span.is_recording():
                request = GenerateRequest([1], 1, (), "req")
                tracing.generation_span("m", request)
                dropped.append(request.trace_context["traceparent"])
                with library.start_as_current_span("its own") as inner:  # joins the request's trace, not kept
                    assert not inner.is_recording()
                    assert f"{inner.get_span_context().trace_id:032x}" == dropped[-1].split("-")[1]
    kept_ids = [span.context.trace_id for span in exported.get_finished_spans()]
    assert 70 <= len(kept_ids) <= 130 and len(kept_ids) + len(dropped) == 200
    assert all(kept(trace_id, 1 << 63) for trace_id in kept_ids)
    assert all(not kept(int(parent.split("-")[1], 16), 1 << 63) and parent.endswith("-02") for parent in dropped)
