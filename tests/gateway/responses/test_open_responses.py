"""The Open Responses compliance scenarios (openresponses/openresponses `compliance-test`: basic-response,
streaming-response, system-prompt, tool-calling, tool-calling-streaming, multi-turn; image-input is a 400 here,
gpt-oss reads text), each checked against what the spec's schemas require: the response object's required
fields with their types (numbers are numbers, never null), the items' fields, and for streams every event's
type within the spec's event union (its reasoning events named `response.reasoning.*` as the published
2026-04-24 document has them: GATEWAY_REASONING_STREAM_EVENTS=reasoning) and its required fields."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway

MODEL = "gpt-oss-120b"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "The city and state"}},
        "required": ["location"],
    },
}
SCENARIOS = {
    "basic-response": {"input": [{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}]},
    "streaming-response": {"stream": True, "input": [{"type": "message", "role": "user", "content": "Count to 5."}]},
    "system-prompt": {
        "input": [
            {"type": "message", "role": "system", "content": "You are a pirate. Always respond in pirate speak."},
            {"type": "message", "role": "user", "content": "Say hello."},
        ]
    },
    "tool-calling": {
        "input": [{"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}],
        "tools": [WEATHER],
    },
    "tool-calling-streaming": {
        "stream": True,
        "input": [{"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}],
        "tools": [WEATHER],
    },
    "multi-turn": {
        "input": [
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {"type": "message", "role": "assistant", "content": "Hello Alice! How can I help you today?"},
            {"type": "message", "role": "user", "content": "What is my name?"},
        ]
    },
}
NUMBER, INTEGER, STRING, BOOLEAN, ARRAY, OBJECT = float, int, str, bool, list, dict
NULLABLE = type(None)
RESOURCE = {  # ResponseResource: every field required, with its type(s)
    "id": STRING, "object": STRING, "created_at": INTEGER, "completed_at": (INTEGER, NULLABLE), "status": STRING,
    "incomplete_details": (OBJECT, NULLABLE), "model": STRING, "previous_response_id": (STRING, NULLABLE),
    "instructions": (STRING, NULLABLE), "output": ARRAY, "error": (OBJECT, NULLABLE), "tools": ARRAY,
    "tool_choice": (STRING, OBJECT), "truncation": STRING, "parallel_tool_calls": BOOLEAN, "text": OBJECT,
    "top_p": (NUMBER, INTEGER), "presence_penalty": (NUMBER, INTEGER), "frequency_penalty": (NUMBER, INTEGER),
    "top_logprobs": INTEGER, "temperature": (NUMBER, INTEGER), "reasoning": (OBJECT, NULLABLE),
    "usage": (OBJECT, NULLABLE), "max_output_tokens": (INTEGER, NULLABLE), "max_tool_calls": (INTEGER, NULLABLE),
    "store": BOOLEAN, "background": BOOLEAN, "service_tier": STRING, "metadata": OBJECT,
    "safety_identifier": (STRING, NULLABLE), "prompt_cache_key": (STRING, NULLABLE),
}  # fmt: skip
ITEMS = {
    "message": ("id", "status", "role", "content"),
    "function_call": ("id", "call_id", "name", "arguments", "status"),
    "reasoning": ("id", "summary"),
}
PART = ("item_id", "output_index", "content_index")
EVENTS = {  # the spec's streaming event union: each type's required fields besides type and sequence_number
    "response.created": ("response",), "response.queued": ("response",), "response.in_progress": ("response",),
    "response.completed": ("response",), "response.failed": ("response",), "response.incomplete": ("response",),
    "response.output_item.added": ("output_index", "item"), "response.output_item.done": ("output_index", "item"),
    "response.content_part.added": (*PART, "part"), "response.content_part.done": (*PART, "part"),
    "response.output_text.delta": (*PART, "delta"), "response.output_text.done": (*PART, "text"),
    "response.refusal.delta": (*PART, "delta"), "response.refusal.done": (*PART, "refusal"),
    "response.reasoning.delta": (*PART, "delta"), "response.reasoning.done": (*PART, "text"),
    "response.output_text.annotation.added": (*PART, "annotation_index", "annotation"),
    "response.function_call_arguments.delta": ("item_id", "output_index", "delta"),
    "response.function_call_arguments.done": ("item_id", "output_index", "arguments"),
    "error": ("error",),
}  # fmt: skip


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    settings = gateway_settings(tmp_path_factory.mktemp("open-responses"), reasoning_stream_events="reasoning")
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


def _post(live: LiveGateway, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        live.url + "/v1/responses",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-tenant-a"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as failed:
        return failed.code, failed.read().decode()


def _problems(resource: dict) -> list[str]:
    problems = [f"{name}: {resource.get(name)!r}" for name, kind in RESOURCE.items() if name not in resource]
    problems += [
        f"{name} is {type(resource[name]).__name__}"
        for name, kind in RESOURCE.items()
        if name in resource
        and (not isinstance(resource[name], kind) or isinstance(resource[name], bool) != (kind is BOOLEAN))
    ]
    reasoning = resource.get("reasoning")
    if isinstance(reasoning, dict) and not {"effort", "summary"} <= reasoning.keys():
        problems.append("reasoning lacks effort or summary")
    for tool in resource.get("tools", []):
        problems += [
            f"tool lacks {key}" for key in ("type", "name", "description", "parameters", "strict") if key not in tool
        ]
    for item in resource.get("output", []):
        problems += [f"{item['type']} lacks {key}" for key in ITEMS.get(item["type"], ()) if key not in item]
    return problems


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_compliance_scenario_meets_the_spec(live, scenario):
    body = SCENARIOS[scenario]
    status, text = _post(live, body)
    assert status == 200, text
    if body.get("stream"):
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        for event in events:
            assert event["type"] in EVENTS, event["type"]
            assert isinstance(event["sequence_number"], int)
            missing = [key for key in EVENTS[event["type"]] if key not in event]
            assert not missing, (event["type"], missing)
        resource = events[-1]["response"]
        assert events[-1]["type"] == "response.completed"
    else:
        resource = json.loads(text)
    assert not _problems(resource), _problems(resource)
    assert resource["status"] == "completed" and resource["output"]
    if scenario.startswith("tool-calling"):
        assert any(item["type"] == "function_call" for item in resource["output"])
    if scenario == "tool-calling-streaming":
        kinds = [event["type"] for event in events]
        assert {"response.function_call_arguments.delta", "response.function_call_arguments.done"} <= set(kinds)
        assert any(
            e.get("item", {}).get("type") == "function_call"
            for e in events
            if e["type"].startswith("response.output_item")
        )


def test_image_input_is_a_400_naming_it(live):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    status, text = _post(live, {"input": [{"type": "message", "role": "user", "content": [image]}]})
    assert status == 400 and json.loads(text)["error"]["param"].startswith("input[0].content[0]")
