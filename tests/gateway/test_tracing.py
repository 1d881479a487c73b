"""OpenTelemetry traces from a `serve` process (OTLP over HTTP to a receiver in the test, decoded with
opentelemetry-proto): a streamed Responses call that uses a hosted MCP tool on a remote fake vLLM, coming in
with a W3C `traceparent`, is one trace under the caller's span, its spans nested request → admission, prompt,
store, generation (twice: before and after the tool) and the tool call; the fake vLLM received the generation's
`traceparent` (the same trace); no span attribute holds the request's canary or the model's output; the access
log line names the trace and the latency histogram carries it as an OpenMetrics exemplar. The built-in engine's
queue wait, prefill and decode are spans of the generation. With the collector gone, requests are neither
slowed nor failed, and the spans that do not fit the bounded queue are counted."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from fake_upstreams import FakeUpstream
from hosted_servers import McpTestServer
from live_gateway import GatewayProcess
from otlp_receiver import OtlpReceiver
from redis_servers import free_port

MODEL = "gpt-oss-120b"
CANARY = "CANARY-7f3a9c"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SCRIPT = {
    "rules": [
        {"match": {"tool": "^5$"}, "emit": [{"analysis": "It answered."}, {"final": "2 + 3 = 5"}]},
        {
            "match": {"user": "add"},
            "emit": [{"tool_call": {"namespace": "calc", "name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"emit": [{"final": "Hello."}]},
    ]
}


def _env(tmp_path: Path, upstream: FakeUpstream, mcp: McpTestServer, endpoint: str, **extra: str) -> dict[str, str]:
    hosted = {
        "mcp": {"allowed_urls": {"default": [mcp.url]}},
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
    }
    return {
        "GATEWAY_BACKEND": "vllm",
        "GATEWAY_BACKEND_URLS": upstream.url,
        "GATEWAY_MODELS": MODEL,
        "GATEWAY_AUTH": "off",
        "GATEWAY_HOSTED_TOOLS": json.dumps(hosted),
        "GATEWAY_METRICS_PUBLIC": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "gateway-under-test",
        **extra,
    }


@pytest.fixture(scope="module")
def servers():
    upstream = FakeUpstream("vllm", SCRIPT).start()
    mcp = McpTestServer().start()
    yield upstream, mcp
    upstream.stop()
    mcp.stop()


def test_a_streamed_tool_call_is_one_trace_nested_and_joined_by_the_model_server(tmp_path, servers):
    upstream, mcp = servers
    receiver = OtlpReceiver().start()
    gateway = GatewayProcess(_env(tmp_path, upstream, mcp, receiver.url), tmp_path / "gateway.log").start()
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
        tool = {"type": "mcp", "server_label": "calc", "server_url": mcp.url, "require_approval": "never"}
        caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
        stream = client.responses.create(
            model=MODEL, input=f"add these {CANARY}", tools=[tool], stream=True, extra_headers=caller
        )
        events = [event.type for event in stream]
        assert events[-1] == "response.completed"
        _await_export(lambda: any(s["name"].startswith("POST") for s in receiver.spans))
        log = gateway.log_text()
        scrape = urllib.request.Request(gateway.url + "/metrics", headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(scrape, timeout=5) as response:
            openmetrics = response.read().decode()
    finally:
        gateway.stop()
        receiver.stop()

    spans = [s for s in receiver.spans if s["trace"] == CALLER_TRACE]
    others = [(s["name"], s["parent"]) for s in receiver.spans if s["trace"] != CALLER_TRACE]
    assert spans and not others, f"one trace, the caller's; also {others}"
    by_id = {s["id"]: s for s in spans}
    children = defaultdict(list)
    for span in spans:
        children[span["parent"]].append(span)
    (root,) = [s for s in spans if s["parent"] == CALLER_SPAN]
    assert root["name"] == "POST /v1/responses" and root["attributes"]["http.response.status_code"] == 200
    assert root["attributes"]["gateway.tenant"] == "default"
    names = [s["name"] for s in children[root["id"]]]
    assert "gateway.admission" in names and "gateway.render_prompt" in names
    generations = [s for s in spans if s["name"] == f"chat {MODEL}"]
    tools = [s for s in spans if s["name"] == "execute_tool mcp_call"]
    assert len(generations) == 2 and len(tools) == 1  # the call, then the answer after the tool's output
    for span in [*generations, *tools]:
        assert _ancestors(span, by_id)[-1] == root["id"], span["name"]
    assert all("gen_ai.first_token" in g["events"] for g in generations)
    assert generations[0]["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert tools[0]["attributes"]["gen_ai.tool.name"] == "add"
    assert any(s["name"].startswith("store.") for s in spans)
    # the fake vLLM got each generation's context: its spans would join this trace
    sent = [call.headers.get("traceparent", "") for call in upstream.calls[-2:]]
    assert [parent.split("-")[1] for parent in sent] == [CALLER_TRACE] * 2
    assert sorted(parent.split("-")[2] for parent in sent) == sorted(g["id"] for g in generations)
    text = json.dumps(receiver.spans)
    assert CANARY not in text and "2 + 3" not in text and '"a": 2' not in text
    assert f'"trace_id":"{CALLER_TRACE}"' in log.replace(" ", "")  # the access log line
    exemplars = [line for line in openmetrics.splitlines() if f'trace_id="{CALLER_TRACE}"' in line]
    assert any(line.startswith("gateway_request_duration_seconds_bucket") for line in exemplars)


def test_a_trace_the_caller_does_not_keep_makes_no_spans_and_tells_the_model_server_so(tmp_path, servers):
    """A `traceparent` with the sampled flag off: no span of that trace is exported, nothing names it in the access
    log, and the fake vLLM gets the same trace, still not sampled; a request with no `traceparent` starts its own
    kept trace (the default sampler keeps every root)."""
    upstream, mcp = servers
    receiver = OtlpReceiver().start()
    gateway = GatewayProcess(_env(tmp_path, upstream, mcp, receiver.url), tmp_path / "gateway.log").start()
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
        unkept = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}
        assert client.responses.create(model=MODEL, input="hello", extra_headers=unkept).status == "completed"
        sent_unkept = upstream.calls[-1].headers.get("traceparent", "")
        assert client.responses.create(model=MODEL, input="hello").status == "completed"
        sent_own = upstream.calls[-1].headers.get("traceparent", "")
        _await_export(lambda: any(s["name"].startswith("POST") for s in receiver.spans))
        log = gateway.log_text()
    finally:
        gateway.stop()
        receiver.stop()

    assert sent_unkept.split("-")[1] == CALLER_TRACE and not _sampled(sent_unkept)
    assert not [s for s in receiver.spans if s["trace"] == CALLER_TRACE]
    assert CALLER_TRACE not in log
    own = sent_own.split("-")[1]
    assert own != CALLER_TRACE and _sampled(sent_own)
    roots = [s for s in receiver.spans if s["trace"] == own and s["name"] == "POST /v1/responses"]
    assert len(roots) == 1 and not roots[0]["parent"]
    assert f'"trace_id":"{own}"' in log.replace(" ", "")


def test_new_traces_are_kept_as_the_sampler_decides_on_the_trace_id_the_model_server_gets(tmp_path, servers):
    """Sampling half the new traces (`parentbased_traceidratio` 0.5): each request's trace id reaches the fake
    vLLM, sampled exactly when the ratio rule keeps that id (its low 64 bits under half the range), and about half
    are (70-130 of 200: a decision taken on one id and a span made on another would keep a quarter); a kept one
    is exported with its one root span and named in the access log, a dropped one is neither; all ids differ."""
    upstream, mcp = servers
    receiver = OtlpReceiver().start()
    half = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    gateway = GatewayProcess(_env(tmp_path, upstream, mcp, receiver.url, **half), tmp_path / "gateway.log").start()
    sent = []
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
        for _ in range(200):
            assert client.responses.create(model=MODEL, input="hello").status == "completed"
            sent.append(upstream.calls[-1].headers.get("traceparent", ""))
        kept = {parent.split("-")[1] for parent in sent if _sampled(parent)}
        _await_export(lambda: len({s["trace"] for s in receiver.spans}) >= len(kept))
        log = gateway.log_text()
    finally:
        gateway.stop()
        receiver.stop()

    traces = [parent.split("-")[1] for parent in sent]
    assert len(set(traces)) == 200 and all(int(trace, 16) for trace in traces)
    for parent, trace in zip(sent, traces, strict=True):
        assert _sampled(parent) == (int(trace[16:], 16) < 2**63), parent  # TraceIdRatioBased's rule at 0.5
    dropped = set(traces) - kept
    assert 70 <= len(kept) <= 130
    roots = [s["trace"] for s in receiver.spans if s["name"] == "POST /v1/responses" and not s["parent"]]
    assert sorted(roots) == sorted(kept)
    assert not {s["trace"] for s in receiver.spans} & dropped
    assert all(f'"trace_id":"{trace}"' in log.replace(" ", "") for trace in kept)
    assert not any(trace in log for trace in dropped)


def _await_export(done: Callable[[], bool]) -> None:
    """Until `done()` says the spans looked for reached the receiver (at most 10 s), then the batch's stragglers."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not done():
        time.sleep(0.05)
    time.sleep(0.3)


def _sampled(traceparent: str) -> bool:
    return bool(int(traceparent.split("-")[3], 16) & 1)


def _ancestors(span: dict, by_id: dict) -> list[str]:
    chain = []
    while span["parent"] in by_id:
        chain.append(span["parent"])
        span = by_id[span["parent"]]
    return chain


def test_a_dead_collector_neither_slows_nor_fails_requests_and_drops_are_counted(tmp_path, servers):
    upstream, mcp = servers
    dead = f"http://127.0.0.1:{free_port()}"
    env = _env(tmp_path, upstream, mcp, dead, OTEL_BSP_MAX_QUEUE_SIZE="4", OTEL_EXPORTER_OTLP_TIMEOUT="5")
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=10)
        started = time.monotonic()
        for _ in range(30):
            assert client.responses.create(model=MODEL, input="hello").output_text == "Hello."
        elapsed = time.monotonic() - started
        with urllib.request.urlopen(gateway.url + "/metrics", timeout=5) as response:
            scraped = response.read().decode()
    finally:
        gateway.stop()
    assert elapsed < 15, f"30 requests took {elapsed:.1f} s"  # each well under a second: nothing waits on export
    dropped = [line for line in scraped.splitlines() if line.startswith("gateway_trace_spans_dropped_total")]
    assert dropped and float(dropped[0].split()[-1]) > 0


def test_the_engine_s_queue_prefill_and_decode_are_spans_of_the_generation(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "model", tiny_config(), "original")
    receiver = OtlpReceiver().start()
    env = {
        "GATEWAY_BACKEND": "onnx",
        "GATEWAY_BACKEND_OPTIONS": json.dumps({"checkpoint": str(checkpoint), "cache_dir": str(tmp_path / "cache")}),
        "GATEWAY_MODELS": MODEL,
        "GATEWAY_AUTH": "off",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start(timeout_s=120)
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for _ in range(2):  # the second reuses the first's prompt: cached tokens on its prefill span
            client.responses.create(model=MODEL, input="hello there", max_output_tokens=16)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(s["name"] == "engine.decode" for s in receiver.spans) < 2:
            time.sleep(0.05)
    finally:
        gateway.stop()
        receiver.stop()
    by_id = {s["id"]: s for s in receiver.spans}
    phases = [s for s in receiver.spans if s["name"].startswith("engine.")]
    assert sorted(s["name"] for s in phases) == ["engine.decode"] * 2 + ["engine.prefill"] * 2 + ["engine.queue"] * 2
    assert all(by_id[s["parent"]]["name"] == f"chat {MODEL}" for s in phases)
    prefills = [s["attributes"]["gateway.cached_tokens"] for s in phases if s["name"] == "engine.prefill"]
    assert prefills[0] == 0 and prefills[1] > 0
