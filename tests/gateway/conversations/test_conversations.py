"""The Conversations API and `conversation` on a response, through the real `openai` SDK against a live gateway
on the memory store and on Redis: tenant-scoped, every object validated against the SDK's pydantic models."""

from __future__ import annotations

import openai
import pytest
from gateway_fixtures import ANALYSIS_AFTER_TOOL, WEATHER_TOOL
from openai.types.conversations import Conversation, ConversationDeletedResource, ConversationItemList
from pydantic import TypeAdapter

MODEL = "gpt-oss-120b"
CONVERSATION = TypeAdapter(Conversation)
ITEMS = TypeAdapter(ConversationItemList)
DELETED = TypeAdapter(ConversationDeletedResource)


def _client(gateway, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _valid(adapter: TypeAdapter, value):
    return adapter.validate_python(value.model_dump(by_alias=True, exclude_unset=True))


def test_conversations_and_their_items_round_trip(gateway):
    api = _client(gateway)
    first = {"type": "message", "role": "user", "content": "Remember the number 7."}
    created = _valid(CONVERSATION, api.conversations.create(items=[first], metadata={"topic": "numbers"}))
    assert created.id.startswith("conv_") and created.metadata == {"topic": "numbers"}
    assert _valid(CONVERSATION, api.conversations.retrieve(created.id)).created_at == created.created_at
    updated = api.conversations.update(created.id, metadata={"topic": "digits"})
    assert updated.metadata == {"topic": "digits"} == api.conversations.retrieve(created.id).metadata
    more = [{"type": "message", "role": "user", "content": f"item {i}"} for i in range(3)]
    added = _valid(ITEMS, api.conversations.items.create(created.id, items=more))
    assert [item.content[0].text for item in added.data] == ["item 0", "item 1", "item 2"]
    listed = _valid(ITEMS, api.conversations.items.list(created.id, order="asc", limit=2))
    assert listed.has_more and [item.content[0].text for item in listed.data] == ["Remember the number 7.", "item 0"]
    rest = api.conversations.items.list(created.id, order="asc", after=listed.last_id)
    assert [item.content[0].text for item in rest.data] == ["item 1", "item 2"] and not rest.has_more
    one = api.conversations.items.retrieve(added.data[1].id, conversation_id=created.id)
    assert one.content[0].text == "item 1" and one.status == "completed"
    assert api.conversations.items.delete(added.data[1].id, conversation_id=created.id).id == created.id
    texts = [item.content[0].text for item in api.conversations.items.list(created.id, order="asc").data]
    assert texts == ["Remember the number 7.", "item 0", "item 2"]
    with pytest.raises(openai.NotFoundError):
        _client(gateway, "sk-tenant-b").conversations.retrieve(created.id)  # another tenant's
    with pytest.raises(openai.NotFoundError):
        _client(gateway, "sk-tenant-b").conversations.items.list(created.id)
    assert _valid(DELETED, api.conversations.delete(created.id)).deleted
    with pytest.raises(openai.NotFoundError):
        api.conversations.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        api.conversations.items.create(created.id, items=more)  # a DELETE is final


def test_a_response_in_a_conversation_reads_it_and_adds_its_items(gateway):
    api = _client(gateway)
    conversation = api.conversations.create(metadata={})
    first = api.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL], conversation=conversation.id
    )
    assert first.conversation.id == conversation.id
    call = first.output[-1]
    items = _valid(ITEMS, api.conversations.items.list(conversation.id, order="asc"))
    assert [item.type for item in items.data] == ["message", "reasoning", "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = api.responses.create(
        model=MODEL, input=[output], tools=[WEATHER_TOOL], conversation={"id": conversation.id}, store=False
    )
    assert second.output_text == "It is sunny in Paris."
    prompt = gateway.backend.prompt_text()
    assert "What is the weather in Paris?" in prompt and "to=functions.get_weather" in prompt
    items = _valid(ITEMS, api.conversations.items.list(conversation.id, order="asc", limit=100))
    kinds = [item.type for item in items.data]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output", "reasoning", "message"]
    assert items.data[-2].content[0].text == ANALYSIS_AFTER_TOOL
    cut = api.responses.create(model=MODEL, input="an essay", max_output_tokens=16, conversation=conversation.id)
    assert cut.status == "incomplete"  # cut short by the token limit: its items still join the conversation
    assert len(api.conversations.items.list(conversation.id, limit=100).data) == len(kinds) + 2
    third = api.responses.create(model=MODEL, input="thanks", conversation=conversation.id)
    assert third.output_text == "You are welcome."
    assert "It is sunny in Paris." in gateway.backend.prompt_text()  # the earlier answer is history
    assert ANALYSIS_AFTER_TOOL not in gateway.backend.prompt_text()  # a completed turn's CoT is not


def test_conversation_errors_name_the_parameter(gateway):
    api = _client(gateway)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.create(model=MODEL, input="hi", conversation="conv_missing")
    assert caught.value.body["param"] == "conversation"
    conversation = api.conversations.create()
    earlier = api.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model=MODEL, input="hi", conversation=conversation.id, previous_response_id=earlier.id)
    assert caught.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError) as caught:
        api.conversations.items.create(conversation.id, items=[{"type": "message", "role": "robot", "content": "x"}])
    assert caught.value.body["param"] == "items[0].role"
    with pytest.raises(openai.BadRequestError) as caught:
        api.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}] * 21)
    assert caught.value.body["param"] == "items"
