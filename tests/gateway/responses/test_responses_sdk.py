"""The Responses API through the real `openai` SDK against a live gateway, on the memory and Redis stores."""

from __future__ import annotations

import json
import time

import openai
import pytest
from gateway_fixtures import (
    ANALYSIS_AFTER_TOOL,
    ANALYSIS_THANKS,
    ANALYSIS_WEATHER,
    WEATHER_TOOL,
)
from pydantic import BaseModel, TypeAdapter, ValidationError

from gateway.responses.shape import ResponseObject

MODEL = "gpt-oss-120b"


def client(gateway, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_create_returns_reasoning_answer_and_usage(gateway):
    response = client(gateway).responses.create(model=MODEL, input="Say hello", metadata={"team": "a"})
    assert response.status == "completed"
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content] == [("reasoning_text", "Just say hello.")]
    assert message.type == "message" and response.output_text == "Hello from the mock."
    usage = response.usage
    assert usage.input_tokens == len(gateway.backend.prompts[-1])
    assert usage.output_tokens > usage.output_tokens_details.reasoning_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert response.metadata == {"team": "a"} and response.store is True and response.model == MODEL
    ResponseObject.model_validate(
        response.model_dump(by_alias=True, exclude_unset=True)
    )  # what we send matches our OpenAPI models


def test_penalties_are_accepted_and_echoed_as_open_responses_requires(gateway):
    api = client(gateway)
    plain = api.responses.create(model=MODEL, input="Say hello").model_dump()
    assert (plain["presence_penalty"], plain["frequency_penalty"]) == (0.0, 0.0)
    penalties = {"presence_penalty": 0.5, "frequency_penalty": -1.0}  # the SDK's create has no such arguments
    given = api.responses.create(model=MODEL, input="Say hello", extra_body=penalties)
    assert (given.model_dump()["presence_penalty"], given.model_dump()["frequency_penalty"]) == (0.5, -1.0)
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model=MODEL, input="Say hello", extra_body={"presence_penalty": 2.5})
    assert caught.value.body["param"] == "presence_penalty"


def test_stream_deltas_carry_obfuscation_padding_unless_the_client_turns_it_off(gateway):
    api = client(gateway)
    deltas = [e for e in api.responses.create(model=MODEL, input="Say hello", stream=True) if e.type.endswith(".delta")]
    assert deltas
    pads = [e.model_extra["obfuscation"] for e in deltas]
    assert all((len(e.delta.encode()) + len(pad)) % 32 == 0 for e, pad in zip(deltas, pads, strict=True))
    assert len(set(pads)) > 1  # random, not a constant
    plain = api.responses.create(
        model=MODEL, input="Say hello", stream=True, extra_body={"stream_options": {"include_obfuscation": False}}
    )
    assert not [e for e in plain if e.type.endswith(".delta") and "obfuscation" in (e.model_extra or {})]


def test_a_function_tool_is_echoed_with_every_field(gateway):
    raw = client(gateway).responses.with_raw_response.create(
        model=MODEL, input="Say hello", tools=[{"type": "function", "name": "ping"}]
    )
    (tool,) = json.loads(raw.text)["tools"]
    assert tool == {"type": "function", "name": "ping", "description": None, "parameters": None, "strict": None}


def test_a_key_the_output_models_do_not_describe_cannot_go_out(gateway):
    response = client(gateway).responses.create(model=MODEL, input="Say hello")
    sent = response.model_dump(by_alias=True, exclude_unset=True)
    sent["output"][1]["surprise"] = 1  # as a builder that drifted from the models would send it
    with pytest.raises(ValidationError, match="surprise"):
        ResponseObject.model_validate(sent)
    with pytest.raises(ValidationError, match="unexpected"):
        ResponseObject.model_validate({**response.model_dump(by_alias=True, exclude_unset=True), "unexpected": 1})


def test_stream_events_are_numbered_paired_and_terminal(gateway):
    events = list(client(gateway).responses.create(model=MODEL, input="Say hello", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type == "response.completed"
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.output_index for e in added] == [e.output_index for e in done] == [0, 1]
    assert [(a.item.type, a.item.id) for a in added] == [(d.item.type, d.item.id) for d in done]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == next(e.text for e in events if e.type == "response.reasoning_text.done") == "Just say hello."
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello from the mock." == events[-1].response.output_text
    first_delta = next(i for i, e in enumerate(events) if e.type == "response.output_text.delta")
    part_added = next(
        i for i, e in enumerate(events) if e.type == "response.content_part.added" and e.output_index == 1
    )
    assert part_added < first_delta


def test_stream_helper_with_a_tool_call(gateway):
    with client(gateway).responses.stream(model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
    assert call.call_id.startswith("call_")


class Person(BaseModel):
    name: str
    age: int


def test_parse_with_a_pydantic_model(gateway):
    parsed = client(gateway).responses.parse(model=MODEL, input="Who is Ada?", text_format=Person)
    assert parsed.output_parsed == Person(name="Ada", age=36)
    prompt = gateway.backend.prompt_text()
    assert "# Response Formats" in prompt and "## Person" in prompt


def _weather_turn(api, **extra):
    return api.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL], **extra)


def test_tool_loop_by_previous_response_id_keeps_the_turns_cot(gateway):
    api = client(gateway)
    first = _weather_turn(api, instructions="Be brief.")
    call = first.output[-1]
    assert call.type == "function_call"
    second = api.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"weather": "sunny"}'}],
    )
    prompt = gateway.backend.prompt_text()
    assert ANALYSIS_WEATHER in prompt  # the turn in progress keeps its chain of thought
    assert "Be brief." not in prompt  # instructions are not inherited
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"weather": "sunny"}' in prompt
    assert second.output_text == "It is sunny in Paris."
    third = api.responses.create(model=MODEL, previous_response_id=second.id, input="thanks!")
    prompt = gateway.backend.prompt_text()
    assert ANALYSIS_WEATHER not in prompt and ANALYSIS_AFTER_TOOL not in prompt  # a completed turn's CoT is dropped
    assert "It is sunny in Paris." in prompt and third.output_text == "You are welcome."


def test_tool_loop_by_full_replay_as_the_agents_sdk_sends_it(gateway):
    api = client(gateway)
    first = _weather_turn(api, store=False)
    reasoning, call = first.output
    replay = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "id": reasoning.id,
            "type": "reasoning",
            "summary": [],
            "content": [c.model_dump() for c in reasoning.content],
        },
        {
            "id": call.id,
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny", "status": "completed"},
    ]
    second = api.responses.create(model=MODEL, input=replay, tools=[WEATHER_TOOL], include=[], instructions="")
    assert ANALYSIS_WEATHER in gateway.backend.prompt_text()
    assert second.output_text == "It is sunny in Paris."


def test_tool_loop_with_encrypted_reasoning_and_no_store(gateway):
    api = client(gateway)
    first = _weather_turn(api, store=False, include=["reasoning.encrypted_content"])
    reasoning, call = first.output
    assert reasoning.encrypted_content.startswith("gwr1.") and ANALYSIS_WEATHER not in reasoning.encrypted_content
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)  # store: false keeps nothing
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content}
    tail = [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    user = {"role": "user", "content": "What is the weather in Paris?"}
    second = api.responses.create(model=MODEL, input=[user, sealed, *tail], tools=[WEATHER_TOOL], store=False)
    assert ANALYSIS_WEATHER in gateway.backend.prompt_text() and second.output_text == "It is sunny in Paris."

    blob = reasoning.encrypted_content
    tampered = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    for bad, api_key in ((tampered, "sk-tenant-a"), (blob, "sk-tenant-b")):
        with pytest.raises(openai.BadRequestError) as info:
            client(gateway, api_key).responses.create(
                model=MODEL, input=[user, {**sealed, "encrypted_content": bad}, *tail], store=False
            )
        assert info.value.body["param"] == "input[1].encrypted_content"


def test_get_delete_and_input_items_are_tenant_scoped(gateway):
    api = client(gateway)
    created = api.responses.create(model=MODEL, input=[{"role": "user", "content": "Say hello"}])
    fetched = api.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    items = api.responses.input_items.list(created.id)
    assert [(item.type, item.role, item.content[0].text) for item in items.data] == [("message", "user", "Say hello")]
    assert items.data[0].id.startswith("msg_")
    with pytest.raises(openai.NotFoundError) as info:
        client(gateway, "sk-tenant-b").responses.retrieve(created.id)
    assert info.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        client(gateway, "sk-tenant-b").responses.delete(created.id)
    api.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(created.id)


def test_input_items_pagination(gateway):
    api = client(gateway)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(5)]
    created = api.responses.create(model=MODEL, input=turns)
    page = api.responses.input_items.list(created.id, limit=2, order="asc")
    assert [item.content[0].text for item in page.data] == ["m0", "m1"] and page.has_more
    rest = api.responses.input_items.list(created.id, limit=10, order="asc", after=page.last_id)
    assert [item.content[0].text for item in rest.data] == ["m2", "m3", "m4"] and not rest.has_more
    newest = api.responses.input_items.list(created.id, limit=1)
    assert newest.data[0].content[0].text == "m4"


def _wait_for(api, response_id: str, statuses: tuple[str, ...], timeout_s: float = 20):
    deadline = time.monotonic() + timeout_s
    while True:
        response = api.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_background_runs_to_completion(gateway):
    api = client(gateway)
    started = api.responses.create(model=MODEL, input="Say hello", background=True)
    assert started.status == "queued" and started.background is True
    finished = _wait_for(api, started.id, ("completed",))
    assert finished.status == "completed" and finished.output_text == "Hello from the mock."


def test_background_cancel(gateway):
    api = client(gateway)
    started = api.responses.create(model=MODEL, input="answer slowly", background=True)
    assert _wait_for(api, started.id, ("in_progress",)).status in ("queued", "in_progress")
    cancelled = api.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    time.sleep(0.3)
    assert api.responses.retrieve(started.id).status == "cancelled"
    plain = api.responses.create(model=MODEL, input="Say hello")
    with pytest.raises(openai.BadRequestError):
        api.responses.cancel(plain.id)  # only background responses can be cancelled


def test_max_output_tokens_gives_incomplete(gateway):
    api = client(gateway)
    response = api.responses.create(model=MODEL, input="write an essay", max_output_tokens=40)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 40 and response.output[-1].status == "incomplete"
    events = list(api.responses.create(model=MODEL, input="write an essay", max_output_tokens=40, stream=True))
    assert events[-1].type == "response.incomplete"


def test_an_unknown_foreign_deleted_or_unstored_previous_response_is_previous_response_not_found(gateway):
    """OpenAI's 400 `previous_response_not_found`, the code clients key on to resend the whole context."""
    api = client(gateway)
    mine = api.responses.create(model=MODEL, input="Say hello")
    deleted = api.responses.create(model=MODEL, input="Say hello")
    api.responses.delete(deleted.id)
    unstored = api.responses.create(model=MODEL, input="Say hello", store=False)
    cases = [("sk-tenant-a", "resp_missing"), ("sk-tenant-b", mine.id), ("sk-tenant-a", deleted.id)]
    for key, response_id in [*cases, ("sk-tenant-a", unstored.id)]:
        with pytest.raises(openai.BadRequestError) as info:
            client(gateway, key).responses.create(model=MODEL, input="hi", previous_response_id=response_id)
        assert info.value.status_code == 400 and info.value.code == "previous_response_not_found"
        assert info.value.body["param"] == "previous_response_id" and info.value.type == "invalid_request_error"
        assert response_id in info.value.message
    assert api.responses.create(model=MODEL, input="hi", previous_response_id=mine.id).status == "completed"


def test_tool_choice_the_mock_cannot_enforce_fails_honestly(gateway):
    api = client(gateway)
    response = api.responses.create(model=MODEL, input="Say hello", tools=[WEATHER_TOOL], tool_choice="required")
    assert response.status == "failed" and response.error.code == "server_error"  # the SDK's enum allows no other
    assert response.error.message.startswith("constraint_not_enforced: tool_choice required")
    assert response.output_text == "Hello from the mock."  # the output is kept, not hidden
    api.responses.create(model=MODEL, input="Say hello", tools=[WEATHER_TOOL], tool_choice="none")
    assert "get_weather" not in gateway.backend.prompt_text()  # tools it may not call are not offered
    named = {"type": "function", "name": "get_weather"}
    response = api.responses.create(model=MODEL, input="weather in Paris", tools=[WEATHER_TOOL], tool_choice=named)
    assert response.status == "completed" and response.output[-1].name == "get_weather"


def test_third_tenant_thanks_turn_uses_its_own_cot_only(gateway):
    """A final answer's CoT is shown to the client but never replayed into the next prompt."""
    api = client(gateway)
    first = api.responses.create(model=MODEL, input="thanks")
    assert first.output[0].content[0].text == ANALYSIS_THANKS
    api.responses.create(model=MODEL, input="Say hello", previous_response_id=first.id)
    assert ANALYSIS_THANKS not in gateway.backend.prompt_text()


@pytest.mark.parametrize("store", [True, False])
def test_replayed_calls_without_reasoning_recover_the_stored_cot(gateway, store):
    """A client that drops reasoning items gets them back by call id, only if turn 1 was stored."""
    api = client(gateway)
    call = _weather_turn(api, store=store).output[-1]
    replay = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    api.responses.create(model=MODEL, input=replay, tools=[WEATHER_TOOL])
    assert (ANALYSIS_WEATHER in gateway.backend.prompt_text()) is store


def test_every_object_and_event_validates_against_the_sdks_models(gateway):
    """The SDK only constructs its models from what it receives; here each is validated: plain, streamed,
    tool call, structured output, incomplete, failed by an unenforceable constraint, background, input items."""
    response_model = TypeAdapter(openai.types.responses.Response)
    event_model = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    items_model = TypeAdapter(openai.types.responses.response_item_list.ResponseItemList)
    api = client(gateway)

    def valid(response):
        return response_model.validate_python(response.model_dump(by_alias=True, exclude_unset=True))

    bodies = [
        {"input": "Say hello"},
        {"input": "What is the weather in Paris?", "tools": [WEATHER_TOOL]},
        {"input": "Ada is 36", "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}}},
        {"input": "an essay", "max_output_tokens": 20},
        {"input": "Say hello", "tools": [WEATHER_TOOL], "tool_choice": "required"},
    ]
    statuses = []
    for body in bodies:
        statuses.append(valid(api.responses.create(model=MODEL, **body)).status)
        events = [
            event_model.validate_python(e.model_dump(by_alias=True, exclude_unset=True))
            for e in api.responses.create(model=MODEL, stream=True, **body)
        ]
        assert events[-1].type in ("response.completed", "response.incomplete", "response.failed")
    assert statuses == ["completed", "completed", "completed", "incomplete", "failed"]
    background = api.responses.create(model=MODEL, input="Say hello", background=True)
    while valid(api.responses.retrieve(background.id)).status in ("queued", "in_progress"):
        time.sleep(0.05)
    items_model.validate_python(
        api.responses.input_items.list(background.id).model_dump(by_alias=True, exclude_unset=True)
    )
