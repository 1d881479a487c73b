"""Two `gpt-oss-gateway serve` processes sharing one redis-server, as replicas behind a load balancer."""

from __future__ import annotations

import json
import re
import time

import openai
import pytest
from gateway_fixtures import ANALYSIS_WEATHER, LONG_TEXT, TEST_KEYS, WEATHER_TOOL, flush
from live_gateway import GatewayProcess

MODEL = "gpt-oss-120b"
SCRIPT = {
    "rules": [
        {
            "match": {"user": "weather"},
            "emit": [{"analysis": ANALYSIS_WEATHER}, {"tool_call": {"name": "get_weather", "arguments": {"c": 1}}}],
        },
        # turn 2 answers "saw-cot" only if the prompt it gets carries turn 1's chain of thought
        {"match": {"prompt": re.escape(ANALYSIS_WEATHER)}, "emit": [{"final": "saw-cot"}]},
        {"match": {"user": "slowly"}, "token_delay_ms": 30, "emit": [{"analysis": LONG_TEXT}, {"final": "late"}]},
        {"emit": [{"final": "no-cot"}]},
    ]
}


@pytest.fixture
def replicas(redis_server, tmp_path):
    flush(redis_server)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_REDIS_URL": redis_server.url,
        "GATEWAY_MOCK_SCRIPT": str(script),
        "GATEWAY_REASONING_KEYS": TEST_KEYS,
    }
    started = []
    try:
        for name in ("a", "b"):
            started.append(GatewayProcess(env, tmp_path / f"{name}.log").start())
        yield started
    finally:
        for process in started:
            process.stop()


def _client(process: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=process.url + "/v1", api_key="sk-shared", max_retries=0, timeout=30)


def test_turn_two_on_another_replica_continues_turn_ones_chain_of_thought(replicas):
    a, b = (_client(p) for p in replicas)
    first = a.responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL])
    call = first.output[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = b.responses.create(model=MODEL, previous_response_id=first.id, input=[output], tools=[WEATHER_TOOL])
    assert second.output_text == "saw-cot"
    assert b.responses.retrieve(first.id).id == first.id
    assert [item.type for item in b.responses.input_items.list(first.id).data] == ["message"]
    for process in replicas:
        log = process.log_text()
        assert '"route":"/v1/responses"' in log  # the access log is there, and holds no prompt, output or CoT
        assert ANALYSIS_WEATHER not in log and "weather in Paris" not in log and "saw-cot" not in log


def test_encrypted_reasoning_sealed_on_one_replica_opens_on_the_other(replicas):
    a, b = (_client(p) for p in replicas)
    first = a.responses.create(
        model=MODEL, input="weather?", tools=[WEATHER_TOOL], store=False, include=["reasoning.encrypted_content"]
    )
    reasoning, call = first.output
    replay = [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    assert b.responses.create(model=MODEL, input=replay, tools=[WEATHER_TOOL], store=False).output_text == "saw-cot"


def test_cancel_on_one_replica_stops_a_background_response_on_the_other(replicas):
    a, b = (_client(p) for p in replicas)
    started = a.responses.create(model=MODEL, input="answer slowly", background=True)
    deadline = time.monotonic() + 10
    while b.responses.retrieve(started.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.responses.cancel(started.id).status == "cancelled"
    time.sleep(2.5)  # the owner polls the shared store for cancellation once a second
    final = a.responses.retrieve(started.id)
    assert final.status == "cancelled"
    assert final.output, "the owner stored the partial output when it stopped"
