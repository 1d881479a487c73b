"""Shapes the SDKs send or validate, through the real `openai` SDK against a live gateway: input token
counts, unknown routes, text-only content, what the SDK's own returned objects carry when sent back, the
efforts and service tiers the SDK allows."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import openai
import pytest
from backports import zstd
from gateway_fixtures import HTTP_AUTH, WEATHER_TOOL

MODEL = "gpt-oss-120b"


def _client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=30)


def test_input_tokens_counts_the_prompt_a_create_would_render(gateway):
    api = _client(gateway)
    body = {"input": "What is the weather in Paris?", "tools": [WEATHER_TOOL], "instructions": "Be brief."}
    created = api.responses.create(model=MODEL, **body)
    counted = api.responses.input_tokens.count(model=MODEL, **body)
    assert counted.object == "response.input_tokens" and counted.input_tokens == created.usage.input_tokens
    assert api.responses.input_tokens.count(**body).input_tokens == counted.input_tokens  # model left out
    follow = {"input": "And in Rome?", "previous_response_id": created.id, "tools": [WEATHER_TOOL]}
    later = api.responses.create(model=MODEL, **follow)
    assert api.responses.input_tokens.count(model=MODEL, **follow).input_tokens == later.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.input_tokens.count(model=MODEL, input=[{"role": "user", "content": 3}])
    assert caught.value.body["param"].startswith("input[0].content")


def test_input_tokens_counts_a_conversations_items_as_a_create_in_it_would(gateway):
    api = _client(gateway)
    conversation = api.conversations.create(items=[{"type": "message", "role": "user", "content": "My name is Ada."}])
    body = {"input": "What is my name?", "conversation": conversation.id}
    counted = api.responses.input_tokens.count(model=MODEL, **body).input_tokens
    alone = api.responses.input_tokens.count(model=MODEL, input=body["input"]).input_tokens
    created = api.responses.create(model=MODEL, **body)
    assert counted == created.usage.input_tokens > alone  # the conversation's items are in the prompt
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.input_tokens.count(model=MODEL, previous_response_id=created.id, **body)
    assert caught.value.body["param"] == "conversation"
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.input_tokens.count(model=MODEL, input="hi", conversation="conv_missing")
    assert caught.value.body["param"] == "conversation"


@pytest.mark.parametrize(
    "method,path",
    [("POST", "/v1/responses/resp_abc"), ("GET", "/v1/responses/resp_abc/unknown"), ("PUT", "/v1/responses/x")],
)
def test_unknown_routes_under_responses_are_404_not_405(gateway, method, path):
    request = urllib.request.Request(gateway.url + path, data=b"{}" if method != "GET" else None, method=method)
    for name, value in {**HTTP_AUTH, "Content-Type": "application/json"}.items():
        request.add_header(name, value)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 404
    assert json.loads(caught.value.read())["error"]["code"] == "not_found"


def test_image_parts_get_a_400_that_says_gpt_oss_reads_text(gateway):
    api = _client(gateway)
    image = {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"}
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model=MODEL, input=[{"role": "user", "content": [image]}])
    assert caught.value.body["param"] == "input[0].content[0].type"
    assert "reads text only" in caught.value.body["message"]
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [part]}])
    assert caught.value.body["param"] == "messages[0].content[0].type"
    assert "reads text only" in caught.value.body["message"]


def test_the_chat_message_the_sdk_returns_can_be_sent_back_as_is(gateway):
    api = _client(gateway)
    question = {"role": "user", "content": "hi"}
    first = api.chat.completions.create(model=MODEL, messages=[question])
    returned = first.choices[0].message.model_dump()  # audio, function_call: null; annotations, refusal
    assert {"audio", "function_call", "refusal", "annotations"} <= set(returned)
    again = api.chat.completions.create(model=MODEL, messages=[question, returned, {"role": "user", "content": "hi"}])
    assert again.choices[0].message.content == "Hello from the mock."
    with pytest.raises(openai.BadRequestError) as caught:
        legacy = {**returned, "function_call": {"name": "f", "arguments": "{}"}}
        api.chat.completions.create(model=MODEL, messages=[question, legacy])
    assert caught.value.body["param"] == "messages[1].function_call"


@pytest.mark.parametrize("effort,level", [("none", "low"), ("minimal", "low"), ("xhigh", "high"), ("max", "high")])
def test_every_effort_the_sdk_allows_maps_to_a_harmony_level(gateway, effort, level):
    api = _client(gateway)
    response = api.responses.create(model=MODEL, input="hi", reasoning={"effort": effort}, service_tier="fast")
    assert response.reasoning.effort == effort and response.status == "completed"
    assert response.service_tier == "default"  # every tier is accepted; gpt-oss has one
    assert f"Reasoning: {level}" in gateway.backend.prompt_text()
    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], reasoning_effort=effort)
    assert f"Reasoning: {level}" in gateway.backend.prompt_text()


def test_a_logprobs_refusal_names_top_logprobs_when_that_asked_for_them(gateway):
    with pytest.raises(openai.BadRequestError) as caught:
        _client(gateway).responses.create(model=MODEL, input="hi", top_logprobs=3)
    assert caught.value.body["param"] == "top_logprobs"


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_compressed_request_bodies_are_read_and_bounded_after_decompression(gateway, encoding):
    compress = gzip.compress if encoding == "gzip" else zstd.compress
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()

    def post(data: bytes):
        request = urllib.request.Request(gateway.url + "/v1/responses", data=compress(data), method="POST")
        for name, value in {**HTTP_AUTH, "Content-Type": "application/json", "Content-Encoding": encoding}.items():
            request.add_header(name, value)
        return urllib.request.urlopen(request, timeout=30)

    with post(body) as response:
        assert json.loads(response.read())["output"][-1]["content"][0]["text"] == "Hello from the mock."
    with pytest.raises(urllib.error.HTTPError) as caught:  # 64 MiB of spaces, a few KiB compressed
        post(b'{"model": "' + MODEL.encode() + b'", "input": "' + b" " * (64 * 1024 * 1024) + b'"}')
    assert caught.value.code == 413


def test_verbosity_becomes_a_developer_instruction(gateway):
    api = _client(gateway)
    api.responses.create(model=MODEL, input="hi", text={"verbosity": "low"})
    assert "# Instructions\n\nKeep the final answer short" in gateway.backend.prompt_text()
    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], verbosity="high")
    assert "# Instructions\n\nGive a thorough final answer" in gateway.backend.prompt_text()
    api.responses.create(model=MODEL, input="hi", text={"verbosity": "medium"})
    assert "# Instructions" not in gateway.backend.prompt_text()
