"""A scripted sequence of requests against `gpt-oss-gateway serve`, then a scrape and a look at its log."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import openai
import pytest
from gateway_fixtures import ANALYSIS_AFTER_TOOL, ANALYSIS_WEATHER, KEY_SECRET, WEATHER_TOOL, write_keys, write_script
from live_gateway import GatewayProcess
from prometheus_client.parser import text_string_to_metric_families
from redis_servers import free_port

from gateway.observability.metrics import INTER_TOKEN_WINDOW, MAX_TENANT_LABELS, OTHER, Metrics

MODEL = "gpt-oss-120b"
KEYS = {"sk-metrics-acme": "acme", "sk-metrics-beta": "beta"}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def served(tmp_path):
    metrics_port = free_port()
    env = {
        "GATEWAY_MOCK_SCRIPT": str(write_script(tmp_path)),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(tmp_path, KEYS)),
        "GATEWAY_METRICS_PORT": str(metrics_port),
        "GATEWAY_LIMITS": json.dumps({"tenants": {"beta": {"requests_per_minute": 1}}}),
    }
    process = GatewayProcess(env, tmp_path / "gateway.log").start()
    yield process, metrics_port
    process.stop()


def test_scripted_requests_then_a_scrape_and_a_clean_log(served):
    process, metrics_port = served
    acme = openai.OpenAI(base_url=process.url + "/v1", api_key="sk-metrics-acme", max_retries=0)
    beta = openai.OpenAI(base_url=process.url + "/v1", api_key="sk-metrics-beta", max_retries=0)
    usages = []
    first = acme.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL])
    usages.append(first.usage)
    call = next(item for item in first.output if item.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    streamed = list(acme.responses.create(model=MODEL, previous_response_id=first.id, input=[output], stream=True))
    usages.append(streamed[-1].response.usage)
    chat = acme.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}])
    beta.responses.create(model=MODEL, input="thanks")
    with pytest.raises(openai.RateLimitError):
        beta.responses.create(model=MODEL, input="thanks")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=process.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        samples = _samples(response.read().decode())
    with pytest.raises(urllib.error.HTTPError) as hidden:
        urllib.request.urlopen(process.url + "/metrics", timeout=10)
    assert hidden.value.code == 404  # not on the public API port

    requests = "gateway_requests_total"
    assert _value(samples, requests, route="/v1/responses", status="200", tenant="acme") == 2
    assert _value(samples, requests, route="/v1/chat/completions", status="200", tenant="acme") == 1
    assert _value(samples, requests, route="/v1/responses", status="200", tenant="beta") == 1
    assert _value(samples, requests, route="/v1/responses", status="429", tenant="beta") == 1
    assert _value(samples, requests, route="/v1/models", status="401", tenant="none") == 1
    assert _value(samples, "gateway_rate_limited_total", limit="requests", tenant="beta") == 1

    tokens = "gateway_tokens_total"
    acme_input = sum(u.input_tokens for u in usages) + chat.usage.prompt_tokens
    acme_output = sum(u.output_tokens for u in usages) + chat.usage.completion_tokens
    acme_reasoning = sum(u.output_tokens_details.reasoning_tokens for u in usages)
    acme_reasoning += chat.usage.completion_tokens_details.reasoning_tokens
    assert _value(samples, tokens, type="input", model=MODEL, tenant="acme") == acme_input
    assert _value(samples, tokens, type="output", model=MODEL, tenant="acme") == acme_output
    assert _value(samples, tokens, type="reasoning", model=MODEL, tenant="acme") == acme_reasoning > 0
    assert _value(samples, tokens, type="cached", model=MODEL, tenant="acme") == 0

    generations = 4  # three for acme, one for beta
    for histogram in (
        "gateway_time_to_first_token_seconds",
        "gateway_time_to_first_content_token_seconds",
        "gateway_backend_generation_seconds",
    ):
        assert _value(samples, histogram + "_count", model=MODEL) == generations, histogram
    all_output = sum(_value(samples, tokens, type="output", model=MODEL, tenant=t) for t in ("acme", "beta"))
    windows = _value(samples, "gateway_inter_token_latency_seconds_count", model=MODEL)  # one per 16 tokens
    assert generations <= windows <= all_output / INTER_TOKEN_WINDOW + generations
    assert _value(samples, "gateway_active_streams") == 0
    assert _value(samples, "gateway_backend_errors_total", model=MODEL) == 0
    assert _value(samples, "gateway_store_operation_duration_seconds_count", operation="save") >= 4
    assert _value(samples, "gateway_store_errors_total", operation="save") == 0

    lines = process.json_lines_until(lambda lines: sum(line.get("event") == "request" for line in lines) >= 7)
    log = process.log_text()
    access = [line for line in lines if line.get("event") == "request"]
    assert len(access) == 7  # six API calls and the refused /metrics on the API port
    assert {line["status"] for line in access} == {200, 429, 401, 404}
    stream_line = next(line for line in access if line["route"] == "/v1/responses" and line["output_tokens"])
    assert stream_line["tenant"] == "acme" and stream_line["request_id"] and stream_line["duration_ms"] > 0
    for secret in (
        "weather in Paris",
        ANALYSIS_WEATHER,
        ANALYSIS_AFTER_TOOL,
        "It is sunny",
        "You are welcome",
        "sk-metrics-acme",
        "sk-wrong",
        "sunny",
    ):
        assert secret not in log, secret


def test_request_ids_are_bound_to_every_log_line_of_the_request(served):
    process, _ = served
    request = urllib.request.Request(
        process.url + "/v1/responses",
        data=json.dumps({"model": MODEL, "input": "thanks"}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer sk-metrics-acme",
            "X-Request-ID": "trace-42",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["X-Request-ID"] == "trace-42"

    def traced(lines: list[dict]) -> list[dict]:
        return [line for line in lines if line.get("event") == "request" and line.get("request_id") == "trace-42"]

    access = traced(process.json_lines_until(lambda lines: bool(traced(lines))))
    assert len(access) == 1 and access[0]["tenant"] == "acme"


def test_the_tenant_label_is_bounded():
    seen = Metrics()
    labels = [seen.tenant_label(f"t{i}") for i in range(MAX_TENANT_LABELS + 5)]
    assert labels[:MAX_TENANT_LABELS] == [f"t{i}" for i in range(MAX_TENANT_LABELS)]
    assert set(labels[MAX_TENANT_LABELS:]) == {OTHER}
    assert seen.tenant_label("t0") == "t0" and seen.tenant_label(None) == "none"
    listed = Metrics(["gold"])
    assert [listed.tenant_label(t) for t in ("gold", "t0", "t1")] == ["gold", OTHER, OTHER]


def test_a_stream_its_client_cuts_is_logged_with_the_tokens_it_used(served):
    process, metrics_port = served
    acme = openai.OpenAI(base_url=process.url + "/v1", api_key="sk-metrics-acme", max_retries=0)
    stream = acme.responses.create(model=MODEL, input="say it slowly", stream=True)
    for event in stream:
        if event.type == "response.reasoning_text.delta":
            break  # the client goes away mid-answer
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in process.log_text().splitlines() if line.startswith("{")]
        cut = [line for line in lines if line.get("event") == "request" and line.get("route") == "/v1/responses"]
        if cut:
            break
        time.sleep(0.05)
    assert len(cut) == 1
    assert cut[0]["input_tokens"] > 0 and cut[0]["output_tokens"] > 0, cut[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        samples = _samples(response.read().decode())
    counted = _value(samples, "gateway_tokens_total", type="input", model=MODEL, tenant="acme")
    assert counted == cut[0]["input_tokens"]  # the log line and the metric agree
