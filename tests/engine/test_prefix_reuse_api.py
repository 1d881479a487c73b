"""Prefix reuse through the public API on the onnx engine: each kind of turn a client makes — a repeat, a
`previous_response_id` continuation, a stateless re-send with encrypted reasoning, a Conversations API turn,
a Chat Completions tool loop — prefills only what the last turn did not compute, reports it as
`cached_tokens` (what the engine's counters say it reused) and in /metrics, and another tenant reuses nothing."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway
from redis_servers import free_port

MODEL = "gpt-oss-20b"
BLOCK = 32
UNIT = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": UNIT}]
CALL = {"model": MODEL, "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 160, "temperature": 0}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": UNIT}}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    directory: Path = tmp_path_factory.mktemp("prefix-api")
    checkpoint = make_checkpoint(directory / "model", tiny_config(), "original")
    options = {
        "checkpoint": str(checkpoint),
        "max_positions": 2048,
        "cache_dir": str(directory / "graphs"),
        "page_size": BLOCK,
    }
    engine = {"kind": "onnx", "options": options, "models": [MODEL]}
    settings = gateway_settings(
        directory, backends={"engine": engine}, metrics_port=free_port(), admin_tenants=["test"]
    )
    gateway = LiveGateway(settings).start()
    gateway.wait_until_ready(MODEL)
    yield gateway
    gateway.stop()


def _client(live: LiveGateway, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=120)


def _hits(live: LiveGateway) -> int:
    """Prompt tokens the engine has reused so far."""
    stats = live.services.backends[MODEL].engine_stats()
    assert stats is not None
    return stats.prefix_hit_tokens


def _cached(live: LiveGateway, create) -> tuple[object, int]:
    """(the response, its reported cached tokens), checked against what the engine counted for it."""
    before = _hits(live)
    response = create()
    usage = response.usage
    cached = usage.input_tokens_details.cached_tokens if hasattr(usage, "input_tokens") else None
    if cached is None:
        cached = usage.prompt_tokens_details.cached_tokens
    time.sleep(0.05)  # the engine thread publishes its counters after the step that ended the sequence
    assert cached == _hits(live) - before
    return response, cached


def _blocks(tokens: int) -> int:
    return tokens // BLOCK * BLOCK


def _history(text: str) -> str:
    return f"{text} " + " ".join(f"Line {n}: the forecast for city number {n} is needed." for n in range(30))


def test_a_repeated_request_reuses_all_but_its_last_token(live):
    client = _client(live)
    create = lambda: client.responses.create(input=_history("Repeat me."), **CALL)  # noqa: E731
    first, _ = _cached(live, create)
    again, cached = _cached(live, create)
    assert again.usage.input_tokens == first.usage.input_tokens > 300
    assert cached >= _blocks(first.usage.input_tokens - 1)
    assert _answer(again) == _answer(first)  # greedy: the reused prefix gives the answer a full prefill gave


def _answer(response) -> list[object]:
    """What the model said, without the ids each response gets afresh."""
    return [
        (item.arguments, item.name) if item.type == "function_call" else item.model_dump(exclude={"id"})
        for item in response.output
    ]


def test_a_previous_response_id_continuation_reuses_the_whole_earlier_prompt(live):
    client = _client(live)
    first, _ = _cached(live, lambda: client.responses.create(input=_history("Continue me."), **CALL))
    call = next(item for item in first.output if item.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}
    follow = {**CALL, "previous_response_id": first.id}
    second, cached = _cached(live, lambda: client.responses.create(input=[output], **follow))
    assert second.status == "completed", second.error
    assert cached >= _blocks(first.usage.input_tokens)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_consecutive_turns_on_one_websocket_reuse_the_socket_s_prompt(live):
    """responses.connect(): the second turn, continued by previous_response_id with store: false (held by the
    socket), prefills only what the first did not compute."""
    client = _client(live)

    def turn(connection, **body):
        connection.response.create(**{**CALL, "store": False, **body})
        for event in connection:
            if event.type in ("response.completed", "response.failed", "response.incomplete"):
                return event.response
            assert event.type != "error", event
        raise AssertionError("the socket closed")

    with client.responses.connect() as connection:
        first, _ = _cached(live, lambda: turn(connection, input=_history("Socket me.")))
        call = next(item for item in first.output if item.type == "function_call")
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "fog"}
        second, cached = _cached(live, lambda: turn(connection, input=[output], previous_response_id=first.id))
    assert second.status == "completed", second.error
    assert cached >= _blocks(first.usage.input_tokens)


def test_a_generate_false_create_prefills_what_the_socket_s_next_turn_reuses(live):
    """responses.connect() with generate: false (as Codex prewarms a session): nothing is answered, the engine
    prefills the prompt, and the continuation finds it cached."""
    client = _client(live)
    with client.responses.connect() as connection:
        connection.response.create(input=_history("Prewarm me."), generate=False, **{**CALL, "store": False})
        prepared = next(event for event in connection if event.type == "response.completed").response
        assert prepared.output == []
        time.sleep(0.05)
        before = _hits(live)
        follow = {**CALL, "store": False, "previous_response_id": prepared.id}
        connection.response.create(input="What is the weather?", **follow)
        answered = next(event for event in connection if event.type in ("response.completed", "response.failed"))
    cached = answered.response.usage.input_tokens_details.cached_tokens
    assert cached >= _blocks(prepared.usage.input_tokens) and cached == _hits(live) - before


def test_a_stateless_client_re_sending_its_history_with_encrypted_reasoning_reuses_it(live):
    client = _client(live)
    stateless = {**CALL, "store": False, "include": ["reasoning.encrypted_content"]}
    question = {"role": "user", "content": _history("Stateless me.")}
    first, _ = _cached(live, lambda: client.responses.create(input=[question], **stateless))
    call = next(item for item in first.output if item.type == "function_call")
    items = [question, *(item.model_dump(exclude_none=True) for item in first.output)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "rain"})
    second, cached = _cached(live, lambda: client.responses.create(input=items, **stateless))
    assert second.status == "completed", second.error
    assert cached >= _blocks(first.usage.input_tokens)


def test_a_conversations_api_turn_reuses_the_conversation_so_far(live):
    client = _client(live)
    conversation = client.conversations.create()
    first, _ = _cached(
        live, lambda: client.responses.create(conversation=conversation.id, input=_history("Converse."), **CALL)
    )
    call = next(item for item in first.output if item.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "snow"}
    second, cached = _cached(
        live, lambda: client.responses.create(conversation=conversation.id, input=[output], **CALL)
    )
    assert second.status == "completed", second.error
    assert cached >= _blocks(first.usage.input_tokens)


def test_a_chat_completions_tool_loop_reports_cached_prompt_tokens(live):
    client = _client(live)
    messages = [{"role": "user", "content": _history("Chat me.")}]
    chat = {"model": MODEL, "tools": CHAT_TOOLS, "tool_choice": "required", "max_tokens": 160, "temperature": 0}
    first, _ = _cached(live, lambda: client.chat.completions.create(messages=messages, **chat))
    message = first.choices[0].message
    assert message.tool_calls, first
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "fog"},
    ]
    second, cached = _cached(live, lambda: client.chat.completions.create(messages=messages, **chat))
    assert cached >= _blocks(first.usage.prompt_tokens)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_another_tenant_reuses_nothing_and_metrics_show_the_hits(live):
    text = _history("Only tenant a has seen this.")
    owner, intruder = _client(live), _client(live, "sk-tenant-b")
    _cached(live, lambda: owner.responses.create(input=text, **CALL))
    _, cached = _cached(live, lambda: intruder.responses.create(input=text, **CALL))
    assert cached == 0  # tenant b's first request: not even the shared system prompt comes from a's pages
    _, cached = _cached(live, lambda: intruder.responses.create(input=text, **CALL))
    assert cached > 0  # b's own repeat does
    port = live.settings.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        scraped = response.read().decode()
    hits = re.search(r'gateway_engine_prefix_tokens_total\{backend="engine",outcome="hit"\} (\S+)', scraped)
    lookups = re.search(r'gateway_engine_prefix_tokens_total\{backend="engine",outcome="lookup"\} (\S+)', scraped)
    assert hits and lookups, scraped
    assert float(hits.group(1)) == _hits(live) > 0
    assert float(lookups.group(1)) > float(hits.group(1))


def test_the_engine_s_queues_by_tenant_and_tier_are_in_metrics_and_for_admins(live):
    """A flex request runs at flex on the engine (echoed), and is counted under its tenant and tier in /metrics
    and in the admins' view of the engine's queues; a tenant's own key cannot read that view."""
    response = _client(live).responses.create(input="Queue me.", service_tier="flex", **CALL)
    assert response.service_tier == "flex"
    time.sleep(0.3)  # the engine thread publishes its queue figures after the step
    port = live.settings.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        scraped = answer.read().decode()
    found = re.search(
        r'gateway_engine_tenant_admitted_total\{backend="engine",tenant="tenant-a",tier="flex"\} (\S+)', scraped
    )
    assert found and float(found.group(1)) >= 1, scraped
    assert 'gateway_engine_tenant_wait_seconds_total{backend="engine",tenant="tenant-a",tier="flex"}' in scraped
    request = urllib.request.Request(f"{live.url}/v1/admin/engine_queues", headers={"Authorization": "Bearer sk-test"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        view = json.loads(answer.read())
    rows = {(row["tenant"], row["service_tier"]): row for row in view["engines"][MODEL]["queues"]}
    assert rows[("tenant-a", "flex")]["admitted"] >= 1 and rows[("tenant-a", "flex")]["mean_wait_s"] >= 0
    with pytest.raises(openai.PermissionDeniedError):
        _client(live).get("/admin/engine_queues", cast_to=object)
