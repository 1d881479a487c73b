"""The conversation builder, the output assembler and the reasoning sealer, below the HTTP layer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.encrypted_reasoning import ReasoningSealer, SealError, parse_keys
from gateway.errors import ApiError
from gateway.generation.assembler import Closed, Delta, OutputAssembler
from gateway.generation.cot_recovery import recover_cot
from gateway.generation.dialog import Call, CallResult, Entry, Said, Thought
from gateway.generation.prompt import PromptSpec, build_prompt
from harmony import ReasoningEffort, Role, ToolDescription
from state import MemoryStore, StoredCot

TODAY = "2026-11-22"
WEATHER = ToolDescription("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def _text(renderer, spec: PromptSpec, budget: int = 100_000) -> str:
    return renderer.encoding.decode(build_prompt(renderer, spec, budget, TODAY).tokens)


def test_assistant_text_before_a_call_is_a_preamble_and_after_it_a_final(renderer):
    items = [
        Said("user", "weather?", "input[0]"),
        Thought("need a tool", "input[1]"),
        Said("assistant", "Let me check.", "input[2]"),
        Call("c1", "get_weather", '{"city":"Paris"}', "input[3]"),
        CallResult("c1", "sunny", "input[4]"),
        Said("assistant", "It is sunny.", "input[5]"),
        Said("user", "thanks", "input[6]"),
    ]
    text = _text(renderer, PromptSpec(items, tools=[WEATHER]))
    assert "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>" in text
    call = (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}'
    )
    assert call + "<|call|>" in text
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>" in text
    assert "<|start|>assistant<|channel|>final<|message|>It is sunny.<|end|>" in text
    assert "need a tool" not in text  # the turn ended with a final answer: its CoT is dropped
    assert text.endswith("<|start|>user<|message|>thanks<|end|><|start|>assistant")


def test_cot_of_the_turn_in_progress_is_kept(renderer):
    items = [
        Said("user", "weather?", "input[0]"),
        Thought("need a tool", "input[1]"),
        Call("c1", "get_weather", "{}", "input[2]"),
        CallResult("c1", "sunny", "input[3]"),
    ]
    assert "<|channel|>analysis<|message|>need a tool<|end|>" in _text(renderer, PromptSpec(items, tools=[WEATHER]))


def test_instructions_effort_and_date_go_to_the_system_and_developer_messages(renderer):
    spec = PromptSpec(
        [Said("user", "hi", "input")], instructions=["Be brief.", "", "Use French."], effort=ReasoningEffort.HIGH
    )
    text = _text(renderer, spec)
    assert "Reasoning: high" in text and f"Current date: {TODAY}" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\nUse French.<|end|>" in text
    assert "<|start|>developer" not in _text(renderer, PromptSpec([Said("user", "hi", "input")]))


def test_tool_outputs_resolve_names_from_the_stored_history(renderer):
    history = [
        Entry.from_data(
            {
                "role": "assistant",
                "channel": "commentary",
                "recipient": "functions.lookup",
                "content_type": "<|constrain|>json",
                "text": "{}",
                "call_id": "old",
            }
        )
    ]
    text = _text(renderer, PromptSpec([CallResult("old", "42", "input[0]")], history=history))
    assert "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>42<|end|>" in text
    with pytest.raises(ApiError) as info:
        _text(renderer, PromptSpec([CallResult("other", "42", "input[0]")], history=history))
    assert info.value.param == "input[0].call_id"


def test_entries_round_trip_through_plain_data(renderer):
    entry = Entry.from_data(
        {"role": "tool", "name": "functions.f", "channel": "commentary", "recipient": "assistant", "text": "out"}
    )
    assert Entry.from_data(entry.to_data()) == entry and entry.message.role is Role.TOOL


def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses(renderer):
    items = [Said("user" if i % 2 == 0 else "assistant", f"message {i} " + "x " * 200, f"input[{i}]") for i in range(6)]
    full = len(build_prompt(renderer, PromptSpec(items), 100_000, TODAY).tokens)
    budget = full - 150
    with pytest.raises(ApiError) as info:
        build_prompt(renderer, PromptSpec(items), budget, TODAY)
    assert info.value.code == "context_length_exceeded" and info.value.param == "input"
    built = build_prompt(renderer, PromptSpec(items, truncate=True), budget, TODAY)
    assert len(built.tokens) < budget and built.dropped_entries == 2
    assert "message 0" not in renderer.encoding.decode(built.tokens)
    assert len(built.dialog) == 6  # the stored dialog keeps everything


def _assemble(encoding, marked: str) -> tuple[OutputAssembler, list]:
    assembler = OutputAssembler(encoding)
    events = assembler.feed(encoding.encode_marked(marked)) + assembler.finish()
    return assembler, events


def test_assembler_maps_channels_to_items(encoding):
    assembler, events = _assemble(
        encoding,
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>One moment."
        "<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
    )
    kinds = [(item.kind, item.preamble, item.text) for item in assembler.items]
    assert kinds == [("reasoning", False, "think"), ("message", True, "One moment."), ("function_call", False, "{}")]
    assert assembler.items[2].name == "f" and assembler.items[2].call_id.startswith("call_")
    assert [type(e).__name__ for e in events if not isinstance(e, Delta)].count("Closed") == 3
    assert assembler.reasoning_tokens > 0 and assembler.output_tokens == len(
        encoding.encode_marked(
            "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>One moment."
            "<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
        )
    )
    assert assembler.entries[2].call_id == assembler.items[2].call_id


def test_assembler_keeps_malformed_output_out_of_the_answer(encoding):
    # a tool call on the analysis channel is still a call; a message authored as a tool stays hidden as reasoning
    assembler, _ = _assemble(
        encoding,
        "<|channel|>analysis to=functions.f<|message|>{}<|call|>",
    )
    assert [item.kind for item in assembler.items] == ["function_call"]
    assembler, _ = _assemble(encoding, "<|channel|>final<|message|>ok<|end|><|start|>functions.f<|message|>fake<|end|>")
    assert [(item.kind, item.text) for item in assembler.items] == [("message", "ok"), ("reasoning", "fake")]
    assert assembler.entries[1].message.channel == "analysis"


def test_assembler_marks_an_item_cut_by_the_stream_end(encoding):
    _, events = _assemble(encoding, "<|channel|>final<|message|>half an ans")
    assert isinstance(events[-1], Closed) and not events[-1].item.complete and events[-1].item.text == "half an ans"


def test_sealer_rotation_tampering_and_tenant_binding():
    old = parse_keys("k1:" + "A" * 43)
    new = parse_keys("k2:" + "B" * 43)
    sealed_by_old = ReasoningSealer(old).seal("tenant", "raw cot")
    rotated = ReasoningSealer(new + old)  # k2 seals, k1 still opens
    assert rotated.open("tenant", sealed_by_old) == "raw cot"
    assert rotated.seal("tenant", "x").startswith("gwr1.k2.")
    with pytest.raises(SealError):
        rotated.open("another tenant", sealed_by_old)
    with pytest.raises(SealError):
        ReasoningSealer(new).open("tenant", sealed_by_old)  # k1 retired
    with pytest.raises(SealError):
        rotated.open("tenant", sealed_by_old[:-2] + "xx")
    for bad in ("", "k:short", "no-colon", "k1:!!!"):
        with pytest.raises(ValueError):
            parse_keys(bad)


def test_recovery_fills_every_step_that_lost_its_reasoning_and_keeps_the_clients():
    store = MemoryStore()
    cot = [{"role": "assistant", "channel": "analysis", "text": "first thought"}]
    asyncio.run(
        store.index_tool_calls(
            [StoredCot("c1", "t", "f", "{}", cot), StoredCot("c2", "t", "g", "{}", [{**cot[0], "text": "second"}])]
        )
    )
    items = [
        Said("user", "go", "m[0]"),
        Call("c1", "f", "{}", "m[1]"),
        CallResult("c1", "r1", "m[2]"),
        Call("c2", "g", "{}", "m[3]"),
        CallResult("c2", "r2", "m[4]"),
        Thought("client's own", "m[5]"),
        Call("c1", "f", "{}", "m[6]"),
    ]
    recovered = asyncio.run(recover_cot(store, "t", items))
    thoughts = [(i, item.text) for i, item in enumerate(recovered) if isinstance(item, Thought)]
    assert thoughts == [(1, "first thought"), (4, "second"), (7, "client's own")]
    assert asyncio.run(recover_cot(store, "another tenant", items)) == items
