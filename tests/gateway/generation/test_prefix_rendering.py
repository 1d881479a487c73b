"""What makes prefix reuse possible: each turn's prompt starts with the token-exact prompt and output of the
turn before, however the client continues (a repeat, `previous_response_id`, a stateless re-send with
encrypted reasoning, a conversation, Chat Completions, the hosted-tool loop inside one response), and after a
final answer (whose chain of thought Harmony drops) with the whole prompt of the turn that answered."""

from __future__ import annotations

import openai
import pytest
from gateway_fixtures import WEATHER_TOOL, gateway_settings
from hosted_servers import McpTestServer
from live_gateway import LiveGateway

from backends.mock import MockBackend

MODEL = "gpt-oss-120b"
SCRIPT = {
    "rules": [
        {"match": {"tool": "sunny"}, "emit": [{"analysis": "It is sunny, say so."}, {"final": "Sunny in Paris."}]},
        {"match": {"tool": "^5$"}, "emit": [{"analysis": "The sum came back."}, {"final": "2 + 3 = 5"}]},
        {
            "match": {"user": "weather"},
            "emit": [
                {"analysis": "The user wants the weather in Paris, so I call get_weather."},
                {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {
            "match": {"user": "add"},
            "emit": [
                {"analysis": "I add with the calculator."},
                {"tool_call": {"namespace": "calc", "name": "add", "arguments": {"a": 2, "b": 3}}},
            ],
        },
        {"emit": [{"analysis": "A thank-you."}, {"final": "You are welcome."}]},
    ]
}


@pytest.fixture(scope="module")
def mcp_server():
    server = McpTestServer().start()
    yield server
    server.stop()


@pytest.fixture
def live(tmp_path, mcp_server):
    hosted = {
        "mcp": {"allowed_urls": {"default": [mcp_server.url]}},
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
    }
    gateway = LiveGateway(gateway_settings(tmp_path, SCRIPT, hosted_tools=hosted)).start()
    yield gateway
    gateway.stop()


def _client(live: LiveGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=30)


def _continues(backend: MockBackend, earlier: int, later: int) -> bool:
    """Whether generation `later` was prompted with generation `earlier`'s prompt and output, token for token."""
    seen = backend.prompts[earlier] + backend.outputs[earlier]
    return backend.prompts[later][: len(seen)] == seen


def _starts_with_prompt(backend: MockBackend, earlier: int, later: int) -> bool:
    return backend.prompts[later][: len(backend.prompts[earlier])] == backend.prompts[earlier]


def _output(call_id: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def test_previous_response_id_turns_extend_the_last_prompt_and_output(live):
    client = _client(live)
    first = client.responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL])
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[_output(first.output[-1].call_id, "sunny")],
        tools=[WEATHER_TOOL],
    )
    client.responses.create(model=MODEL, previous_response_id=second.id, input="thanks", tools=[WEATHER_TOOL])
    backend = live.backend
    assert _continues(backend, 0, 1)
    # the answer ended the turn: its chain of thought is dropped, so the thank-you turn starts over at
    # the answering turn's first analysis; everything up to that turn's first prompt is still reused
    assert not _continues(backend, 1, 2) and _starts_with_prompt(backend, 0, 2)
    assert not _starts_with_prompt(backend, 1, 2)


def test_a_repeat_and_a_stateless_re_send_with_encrypted_reasoning_extend_the_last_prompt(live):
    client = _client(live)
    stateless = {"model": MODEL, "tools": [WEATHER_TOOL], "store": False, "include": ["reasoning.encrypted_content"]}
    question = {"role": "user", "content": "weather in Paris?"}
    first = client.responses.create(input=[question], **stateless)
    client.responses.create(input=[question], **stateless)
    items = [question, *(item.model_dump(exclude_none=True) for item in first.output)]
    items.append(_output(first.output[-1].call_id, "sunny"))
    client.responses.create(input=items, **stateless)
    backend = live.backend
    assert backend.prompts[0] == backend.prompts[1]
    assert _continues(backend, 1, 2)


def test_a_conversation_turn_extends_the_last_prompt_and_output(live):
    client = _client(live)
    conversation = client.conversations.create()
    first = client.responses.create(model=MODEL, conversation=conversation.id, input="weather?", tools=[WEATHER_TOOL])
    output = _output(first.output[-1].call_id, "sunny")
    client.responses.create(model=MODEL, conversation=conversation.id, input=[output], tools=[WEATHER_TOOL])
    client.responses.create(model=MODEL, conversation=conversation.id, input="thanks", tools=[WEATHER_TOOL])
    backend = live.backend
    assert _continues(backend, 0, 1) and _starts_with_prompt(backend, 0, 2)


def test_a_chat_tool_loop_extends_the_last_prompt_and_output(live):
    client = _client(live)
    tools = [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}]
    messages: list = [{"role": "user", "content": "weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    message = first.choices[0].message
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"},
    ]
    client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert _continues(live.backend, 0, 1)  # the call's chain of thought comes back from the store


def test_each_step_of_the_hosted_tool_loop_extends_the_last(live, mcp_server):
    client = _client(live)
    tool = {"type": "mcp", "server_label": "calc", "server_url": mcp_server.url, "require_approval": "never"}
    response = client.responses.create(model=MODEL, input="add 2 and 3", tools=[tool])
    assert [item.type for item in response.output] == [
        "mcp_list_tools",
        "reasoning",
        "mcp_call",
        "reasoning",
        "message",
    ]
    assert len(live.backend.prompts) == 2 and _continues(live.backend, 0, 1)
