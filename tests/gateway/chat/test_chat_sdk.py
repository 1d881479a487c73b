"""Chat Completions and /v1/models through the real `openai` SDK, on the memory and Redis stores."""

from __future__ import annotations

import json
import re

import openai
import pytest
from gateway_fixtures import ANALYSIS_AFTER_TOOL, ANALYSIS_WEATHER, TEST_KEYS, write_script
from live_gateway import FailingBackend, LiveGateway
from pydantic import BaseModel

from gateway.config import Settings

MODEL = "gpt-oss-120b"
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def client(gateway, key: str = "sk-chat-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_create_returns_reasoning_content_and_usage(gateway):
    completion = client(gateway).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == "Hello from the mock."
    assert choice.message.reasoning == "Just say hello."  # the field the Agents SDK and the compatibility test read
    usage = completion.usage
    assert usage.prompt_tokens == len(gateway.backend.prompts[-1])
    assert usage.completion_tokens > usage.completion_tokens_details.reasoning_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens == 0 and completion.object == "chat.completion"


def test_stream_iteration_with_usage(gateway):
    chunks = list(
        client(gateway).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Just say hello." and content == "Hello from the mock."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_helper_assembles_tool_calls(gateway):
    with client(gateway).chat.completions.stream(model=MODEL, messages=[QUESTION], tools=[CHAT_TOOL]) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    call = final.choices[0].message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


class Person(BaseModel):
    name: str
    age: int


def test_parse_with_a_pydantic_model(gateway):
    parsed = client(gateway).chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Who is Ada?"}], response_format=Person
    )
    assert parsed.choices[0].message.parsed == Person(name="Ada", age=36)
    assert "## Person" in gateway.backend.prompt_text()


def _first_turn(api) -> tuple[dict, str]:
    completion = api.chat.completions.create(model=MODEL, messages=[QUESTION], tools=[CHAT_TOOL])
    message = completion.choices[0].message
    assert message.reasoning == ANALYSIS_WEATHER and completion.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }
    return assistant, call.id


@pytest.mark.parametrize("reasoning_field", [None, "reasoning", "reasoning_content"])
def test_tool_loop_recovers_or_takes_the_chain_of_thought(gateway, reasoning_field):
    api = client(gateway)
    assistant, call_id = _first_turn(api)
    sent = "My own notes about the weather call." if reasoning_field else None
    if reasoning_field:
        assistant[reasoning_field] = sent
    tool = {"role": "tool", "tool_call_id": call_id, "content": "sunny"}
    second = api.chat.completions.create(model=MODEL, messages=[QUESTION, assistant, tool], tools=[CHAT_TOOL])
    prompt = gateway.backend.prompt_text()
    if reasoning_field is None:
        assert ANALYSIS_WEATHER in prompt  # dropped by the client, recovered from the store by call id
    else:
        assert sent in prompt and ANALYSIS_WEATHER not in prompt  # the client's reasoning wins
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].message.reasoning == ANALYSIS_AFTER_TOOL

    final = {"role": "assistant", "content": "It is sunny in Paris."}
    api.chat.completions.create(
        model=MODEL, messages=[QUESTION, assistant, tool, final, {"role": "user", "content": "thanks"}]
    )
    prompt = gateway.backend.prompt_text()
    assert ANALYSIS_WEATHER not in prompt and (sent is None or sent not in prompt)  # a completed turn's CoT stays out


def test_recovery_needs_the_same_tenant_name_and_arguments(gateway):
    api = client(gateway)
    assistant, call_id = _first_turn(api)
    tool = {"role": "tool", "tool_call_id": call_id, "content": "sunny"}
    client(gateway, "sk-chat-b").chat.completions.create(model=MODEL, messages=[QUESTION, assistant, tool])
    assert ANALYSIS_WEATHER not in gateway.backend.prompt_text()  # another tenant's call id recovers nothing
    altered = json.loads(json.dumps(assistant))
    altered["tool_calls"][0]["function"]["arguments"] = '{"city": "Rome"}'
    api.chat.completions.create(model=MODEL, messages=[QUESTION, altered, tool])
    assert ANALYSIS_WEATHER not in gateway.backend.prompt_text()  # different arguments: not the stored call


def test_n_stop_and_max_tokens(gateway):
    api = client(gateway)
    several = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert {c.message.content for c in several.choices} == {"Hello from the mock."}
    cut = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stop=["mock", "zzz"])
    assert cut.choices[0].message.content == "Hello from the " and cut.choices[0].finish_reason == "stop"
    streamed = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stop="from", stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "Hello "
    long = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "an essay"}], max_tokens=30)
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 30


def test_seed_gives_the_same_choices_with_a_backend_that_samples(tmp_path):
    script = {"rules": [{"alternatives": [[{"final": f"option {i}"}] for i in range(10)]}]}
    live = LiveGateway(Settings(mock_script=str(write_script(tmp_path, script)), reasoning_keys=TEST_KEYS)).start()
    try:
        api = client(live)

        def answers(seed):
            response = api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], n=4, seed=seed
            )
            return [c.message.content for c in response.choices]

        first = answers(11)
        assert answers(11) == first and len(set(first)) > 1  # choices differ from each other, not between runs
        assert answers(12) != first
    finally:
        live.stop()


def test_models_list_and_get(gateway):
    api = client(gateway)
    models = api.models.list()
    assert [m.id for m in models.data] == ["gpt-oss-120b", "gpt-oss-20b"]
    model = api.models.retrieve("gpt-oss-20b")
    assert model.owned_by == "openai" and model.context_length == 131072 and model.created > 0
    with pytest.raises(openai.NotFoundError) as info:
        api.models.retrieve("gpt-5")
    assert info.value.body["param"] == "model"


BAD = [
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages[0].extra"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"model": MODEL, "messages": [{"role": "tool", "tool_call_id": "zz", "content": "x"}]}, "messages[0].call_id"),
    ({"model": MODEL, "messages": [QUESTION], "n": 0}, "n"),
    ({"model": MODEL, "messages": [QUESTION], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": MODEL, "messages": [QUESTION], "logprobs": True}, "logprobs"),
    ({"model": MODEL, "messages": [QUESTION], "logit_bias": {"1": 5}}, "logit_bias"),
    ({"model": MODEL, "messages": [QUESTION], "tool_choice": "maybe"}, "tool_choice"),
    (
        {"model": MODEL, "messages": [QUESTION], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    ({"model": MODEL, "messages": [QUESTION], "response_format": {"type": "xml"}}, "response_format"),
    ({"model": MODEL, "messages": [QUESTION], "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"model": MODEL, "messages": [QUESTION], "tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"model": MODEL, "messages": [QUESTION], "metadata": {"k": "v" * 513}}, "metadata"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_input_is_a_4xx_naming_the_parameter(gateway, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(**body)
    assert info.value.status_code == 400 and info.value.body["param"] == param, info.value.body
    assert re.search(r"\S", info.value.body["message"])


def test_a_backend_failure_is_a_502_or_an_error_event(encoding):
    live = LiveGateway(Settings(), backend=FailingBackend(encoding)).start()
    try:
        api = client(live)
        with pytest.raises(openai.APIStatusError) as info:
            api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 502 and info.value.body["code"] == "backend_error"
        stream = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        with pytest.raises(openai.APIError, match="backend failed"):
            list(stream)
    finally:
        live.stop()


def test_a_tool_choice_the_backend_cannot_enforce_is_reported(gateway):
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[CHAT_TOOL], tool_choice="required"
    )
    body = json.loads(raw.http_response.text)
    assert body["error"]["code"] == "constraint_not_enforced"
    assert body["choices"][0]["message"]["content"] == "Hello from the mock."
