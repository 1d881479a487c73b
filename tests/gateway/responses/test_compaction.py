"""`responses.compact()` through the real `openai` SDK: the model (the scripted mock) writes the summary from the
conversation, the `compaction` item comes back sealed with the conversation's user messages, and sent back as
input it stands for the turns it replaced (in the developer message, fewer tokens); a tampered, foreign or
mis-purposed item is a 400 naming it; stored responses and Conversations keep the item; a model that writes
no summary is a 502, never a compaction of nothing."""

from __future__ import annotations

import openai
import pytest
from gateway_fixtures import SCRIPT, gateway_settings, start_live_gateway
from live_gateway import LiveGateway
from pydantic import TypeAdapter

MODEL = "gpt-oss-120b"
SUMMARY = "The user planned a trip to Paris in May; they prefer trains; the budget is 900 euros."
LONG_ANSWER = " ".join(["Paris in spring has many museums and long walks along the river."] * 12)
COMPACTING = {
    "match": {"user": "Write the summary of our conversation"},
    "emit": [{"analysis": "Summarise the plan."}, {"final": SUMMARY}],
}
SCRIPTED = {"rules": [COMPACTING, {"match": {"user": "Tell me"}, "emit": [{"final": LONG_ANSWER}]}, *SCRIPT["rules"]]}
CONVERSATION = [
    {"role": "user", "content": "Tell me about Paris in May."},
    {"role": "assistant", "content": LONG_ANSWER},
    {"role": "user", "content": "Tell me how to get there by train on 900 euros."},
    {"role": "assistant", "content": LONG_ANSWER},
]
USER_MESSAGE = TypeAdapter(openai.types.responses.ResponseInputMessageItem)
COMPACTION_ITEM = TypeAdapter(openai.types.responses.ResponseCompactionItem)
USAGE = TypeAdapter(openai.types.responses.ResponseUsage)


@pytest.fixture(params=["memory", "redis"])
def live(request, tmp_path):
    gateway = start_live_gateway(request, tmp_path, SCRIPTED)
    yield gateway
    gateway.stop()


def _client(live, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _compact(api: openai.OpenAI, **body):
    """The SDK's CompactedResponse, each part validated by the SDK's models: the user messages as input message
    items (the SDK's output-item union has no user message), the compaction item, the usage."""
    compacted = api.responses.compact(model=MODEL, **body)
    assert isinstance(compacted, openai.types.responses.CompactedResponse)
    *users, item = [entry.model_dump(by_alias=True, exclude_unset=True, warnings=False) for entry in compacted.output]
    compacted.output = [*(USER_MESSAGE.validate_python(user) for user in users), COMPACTION_ITEM.validate_python(item)]
    USAGE.validate_python(compacted.usage.model_dump())
    return compacted


def test_a_compacted_conversation_carries_on_in_fewer_tokens(live):
    api = _client(live)
    compacted = _compact(api, input=CONVERSATION)
    *users, item = compacted.output
    assert compacted.object == "response.compaction" and item.type == "compaction" and item.id.startswith("cmp_")
    assert [message.content[0].text for message in users] == [CONVERSATION[0]["content"], CONVERSATION[2]["content"]]
    assert SUMMARY not in item.encrypted_content  # sealed
    assert compacted.usage.output_tokens > 0 and compacted.usage.input_tokens > 0
    following = [
        *[entry.model_dump(exclude_none=True) for entry in compacted.output],
        {"role": "user", "content": "thanks"},
    ]
    before = api.responses.input_tokens.count(model=MODEL, input=[*CONVERSATION, {"role": "user", "content": "thanks"}])
    after = api.responses.input_tokens.count(model=MODEL, input=following)
    assert after.input_tokens < before.input_tokens
    answer = api.responses.create(model=MODEL, input=following)
    assert answer.output_text == "You are welcome."
    prompt = live.backend.prompt_text()
    assert SUMMARY in prompt and LONG_ANSWER not in prompt  # the summary stands for the assistant's turns
    assert prompt.index(CONVERSATION[2]["content"]) < prompt.index(SUMMARY) < prompt.rindex("thanks")  # in its place


def test_compacting_a_stored_chain_and_folding_an_earlier_summary_in(live):
    api = _client(live)
    first = api.responses.create(model=MODEL, input="Tell me about Paris in May.")
    compacted = _compact(api, previous_response_id=first.id, input="Tell me how to get there.")
    users = [entry.content[0].text for entry in compacted.output if entry.type == "message"]
    assert users == ["Tell me about Paris in May.", "Tell me how to get there."]
    again = _compact(api, input=[*[entry.model_dump(exclude_none=True) for entry in compacted.output]])
    assert again.output[-1].type == "compaction"
    assert SUMMARY in live.backend.prompt_text()  # the earlier summary was part of what the model summarised


def test_a_tampered_foreign_or_reasoning_blob_is_a_400_naming_the_item(live):
    api = _client(live)
    item = _compact(api, input=CONVERSATION).output[-1].model_dump(exclude_none=True)
    blob = item["encrypted_content"]
    tampered = {**item, "encrypted_content": blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB")}
    reasoning = api.responses.create(model=MODEL, input="thanks", include=["reasoning.encrypted_content"], store=False)
    sealed_reasoning = next(entry for entry in reasoning.output if entry.type == "reasoning").encrypted_content
    for client, candidate in (
        (api, tampered),
        (_client(live, "sk-tenant-b"), item),
        (api, {"type": "compaction", "encrypted_content": sealed_reasoning}),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, candidate])
        assert refused.value.body["param"] == "input[1].encrypted_content", refused.value.body


def test_stored_responses_and_conversations_keep_the_compaction_item(live):
    api = _client(live)
    item = _compact(api, input=CONVERSATION).output[-1].model_dump(exclude_none=True)
    response = api.responses.create(model=MODEL, input=[item, {"role": "user", "content": "thanks"}])
    listed = api.responses.input_items.list(response.id)
    assert [entry.type for entry in listed.data] == ["message", "compaction"]  # newest first
    assert listed.data[1].encrypted_content == item["encrypted_content"]
    conversation = api.conversations.create(items=[item])
    kept = api.conversations.items.list(conversation.id)
    assert [entry.type for entry in kept.data] == ["compaction"]
    continued = api.responses.create(model=MODEL, conversation=conversation.id, input="thanks")
    assert continued.output_text == "You are welcome." and SUMMARY in live.backend.prompt_text()


def test_a_model_that_writes_no_summary_is_a_502(tmp_path):
    silent = {"rules": [{"match": {"user": "Write the summary"}, "emit": [{"analysis": "Hmm."}]}, *SCRIPT["rules"]]}
    gateway = LiveGateway(gateway_settings(tmp_path, silent)).start()
    try:
        with pytest.raises(openai.InternalServerError) as failed:
            _client(gateway).responses.compact(model=MODEL, input=CONVERSATION)
        assert failed.value.status_code == 502 and failed.value.body["code"] == "compaction_failed"
    finally:
        gateway.stop()


# ---- context_management on create: compaction when the prompt passes the threshold ----

COMPACT_AT = [{"type": "compaction", "compact_threshold": 200}]
RESPONSE = TypeAdapter(openai.types.responses.Response)


def _validated(response):
    return RESPONSE.validate_python(response.model_dump(by_alias=True, exclude_unset=True))


def test_a_create_past_the_threshold_compacts_first_and_answers_from_the_summary(live):
    api = _client(live)
    following = [*CONVERSATION, {"role": "user", "content": "thanks"}]
    small = _validated(api.responses.create(model=MODEL, input="thanks", context_management=COMPACT_AT))
    assert [item.type for item in small.output] == ["reasoning", "message"]  # under the threshold: as is
    response = _validated(api.responses.create(model=MODEL, input=following, context_management=COMPACT_AT))
    assert [item.type for item in response.output] == ["compaction", "reasoning", "message"]
    assert response.output_text == "You are welcome."
    prompt = live.backend.prompt_text()
    assert SUMMARY in prompt and LONG_ANSWER not in prompt and prompt.index(SUMMARY) < prompt.rindex("thanks")
    streamed = list(api.responses.create(model=MODEL, input=following, context_management=COMPACT_AT, stream=True))
    added = [event for event in streamed if event.type == "response.output_item.added"]
    assert added[0].item.type == "compaction" and added[0].output_index == 0
    assert [item.type for item in streamed[-1].response.output] == ["compaction", "reasoning", "message"]
    # the item carries the conversation on for a stateless client, as /compact's does
    carried = [response.output[0].model_dump(exclude_none=True), {"role": "user", "content": "thanks"}]
    assert api.responses.create(model=MODEL, input=carried).output_text == "You are welcome."


def test_a_chain_compacted_on_one_turn_stays_compacted_and_a_tool_output_keeps_its_call(live):
    api = _client(live)
    first = api.responses.create(model=MODEL, input=CONVERSATION)
    asked = api.responses.create(
        model=MODEL,
        input="weather in Paris?",
        previous_response_id=first.id,
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    )
    call = next(item for item in asked.output if item.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    answered = api.responses.create(
        model=MODEL, input=[output], previous_response_id=asked.id, context_management=COMPACT_AT
    )
    assert answered.status == "completed" and answered.output[0].type == "compaction"
    assert answered.output_text == "It is sunny in Paris."
    prompt = live.backend.prompt_text()
    assert SUMMARY in prompt and "weather in Paris?" in prompt and LONG_ANSWER not in prompt
    later = api.responses.create(model=MODEL, input="thanks", previous_response_id=answered.id)
    assert later.output_text == "You are welcome."
    assert SUMMARY in live.backend.prompt_text() and LONG_ANSWER not in live.backend.prompt_text()


def test_a_bad_context_management_is_a_400_naming_it(live):
    with pytest.raises(openai.BadRequestError) as refused:
        _client(live).responses.create(
            model=MODEL, input="hi", context_management=[{"type": "truncate", "compact_threshold": 10}]
        )
    assert refused.value.body["param"].startswith("context_management[0]")
