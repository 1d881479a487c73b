"""Constrained decoding in the onnx engine: from a random-weight model (whose unconstrained output is noise),
forced function calls and JSON-schema answers come out valid through both APIs and the openai SDK."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import openai
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from jsonschema import Draft202012Validator
from live_gateway import LiveGateway
from reference import harmony_module, reference_encoding

from backends.base import Constraint
from backends.engine import grammar as grammar_module
from backends.engine.grammar import GrammarCompiler, harmony_grammar
from gateway.config import Settings
from harmony import load_harmony_encoding

MODEL = "gpt-oss-20b"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 10},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["answer", "score", "tags"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER},
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "additionalProperties": False}},
]
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    directory: Path = tmp_path_factory.mktemp("constrained")
    checkpoint = make_checkpoint(directory / "model", tiny_config(), "original")
    options = {"checkpoint": str(checkpoint), "max_positions": 2048, "cache_dir": str(directory / "graphs")}
    settings = Settings(backends={"engine": {"kind": "onnx", "options": options, "models": [MODEL]}})
    live = LiveGateway(settings).start()
    live.wait_until_ready(MODEL)
    yield openai.OpenAI(base_url=live.url + "/v1", api_key="sk-x", max_retries=0)
    live.stop()


def _masked(guide, logits: np.ndarray) -> np.ndarray:
    """The logits with every token the guide forbids here at -inf."""
    allowed = np.unpackbits(guide.allowed().view(np.uint8), bitorder="little")[: len(logits)].view(bool)
    return np.where(allowed, logits, -np.inf)


def test_required_tool_choice_gives_a_call_whose_arguments_match_the_schema(gateway):
    for _ in SEEDS:  # the Responses API has no seed: each run samples afresh
        response = gateway.responses.create(
            model=MODEL,
            input="What is the weather in Oslo?",
            tools=TOOLS,
            tool_choice="required",
            max_output_tokens=160,
            temperature=1.0,
        )
        assert response.status == "completed", response.error
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name in ("get_weather", "get_time")
        schema = WEATHER if calls[0].name == "get_weather" else TOOLS[1]["parameters"]
        Draft202012Validator(schema).validate(json.loads(calls[0].arguments))


def test_a_custom_tool_call_from_the_engine_matches_its_grammar(gateway):
    """Streamed, as Codex asks: the random model's freeform input still comes out in the tool's grammar."""
    tool = {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": ""}}
    tool["format"]["definition"] = PATCH_LARK
    namespace = {"type": "namespace", "name": "ops", "description": "Operations.", "tools": [TOOLS[1]]}
    for _ in SEEDS:
        events = list(
            gateway.responses.create(
                model=MODEL,
                input="Add a file.",
                tools=[tool, namespace],
                tool_choice={"type": "custom", "name": "apply_patch"},
                max_output_tokens=400,
                stream=True,
            )
        )
        response = events[-1].response
        assert response.status == "completed", response.error
        (call,) = [item for item in response.output if item.type == "custom_tool_call"]
        assert re.fullmatch(PATCH_SHAPE, call.input), call.input
        deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
        assert deltas == call.input


def test_a_named_function_through_chat_completions_is_the_one_called(gateway):
    tools = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in TOOLS]
    for seed in SEEDS:
        completion = gateway.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Lima?"}],
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=160,
            temperature=1.0,
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        Draft202012Validator(WEATHER).validate(json.loads(call.function.arguments))


def test_a_json_schema_answer_is_valid_json_of_that_schema_in_both_apis(gateway):
    text_format = {"type": "json_schema", "name": "verdict", "schema": VERDICT, "strict": True}
    for seed in SEEDS:
        response = gateway.responses.create(
            model=MODEL,
            input="Judge this.",
            text={"format": text_format},
            max_output_tokens=160,
            temperature=1.0,
        )
        assert response.status == "completed", response.error
        Draft202012Validator(VERDICT).validate(json.loads(response.output_text))
        streamed = gateway.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Judge this."}],
            response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}},
            max_tokens=160,
            temperature=1.0,
            seed=seed,
            stream=True,
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        Draft202012Validator(VERDICT).validate(json.loads(text))


def test_constrained_outputs_are_harmony_the_reference_parser_reads():
    """Sampled uniformly among allowed tokens, every grammar's output parses with openai-harmony."""
    compiler = GrammarCompiler(load_harmony_encoding(), 201088)
    reference = reference_encoding()
    assistant = harmony_module().Role.ASSISTANT
    rng = np.random.default_rng(0)
    constraints = [
        Constraint("required", ("get_weather",), None, {"get_weather": WEATHER}),
        Constraint("none", (), VERDICT, {"get_weather": WEATHER}),
        Constraint("any", (), VERDICT, {"get_weather": WEATHER}),
    ]
    for constraint in constraints:
        for _ in range(4):
            guide = compiler.guide(constraint, 40)
            tokens: list[int] = []
            while not tokens or tokens[-1] not in (200002, 200012):
                logits = _masked(guide, rng.standard_normal(201088).astype(np.float32))
                token = int(np.argmax(logits))
                guide.accept(token)
                tokens.append(token)
                assert len(tokens) < 200
            messages = reference.parse_messages_from_completion_tokens(tokens, assistant)
            answer = messages[-1]
            body = json.loads(answer.content[0].text)
            if answer.recipient is not None:
                assert constraint.tools != "none" and answer.recipient == "functions.get_weather"
                Draft202012Validator(WEATHER).validate(body)
            else:
                assert constraint.tools != "required" and answer.channel == "final"
                Draft202012Validator(VERDICT).validate(body)
            assert all(message.channel == "analysis" for message in messages[:-1]) and len(messages) <= 2


def test_a_grammar_lists_only_the_allowed_functions_and_bounds_the_reasoning():
    grammar = harmony_grammar(Constraint("required", ("b",), None, {"a": None, "b": None}), 7)
    assert "functions.b " in grammar and "functions.a" not in grammar and "max_tokens=7" in grammar
    assert "analysis" not in harmony_grammar(Constraint("none", (), {}), 0)


PATCH_LARK = (  # Codex's apply_patch grammar, its lines bounded so that random sampling ends
    'start: "*** Begin Patch" LF hunk{1,2} "*** End Patch" LF?\n'
    'hunk: "*** Add File: " /[a-z]{1,8}\\.txt/ LF line{1,3}\n'
    'line: "+" /[a-z ]{0,12}/ LF\n%import common.LF\n'
)
PATCH_SHAPE = r"\*\*\* Begin Patch\n(\*\*\* Add File: [a-z]{1,8}\.txt\n(\+[a-z ]{0,12}\n){1,3}){1,2}\*\*\* End Patch\n?"


def test_a_freeform_tools_input_is_held_to_its_own_grammar():
    """Custom tools' Lark or regex grammars, as sub-grammars of the Harmony one: every sampled call parses
    with openai-harmony, has no `<|constrain|>`, and its raw input matches the tool's grammar."""
    compiler = GrammarCompiler(load_harmony_encoding(), 201088)
    reference = reference_encoding()
    assistant = harmony_module().Role.ASSISTANT
    rng = np.random.default_rng(1)
    grammars = {"apply_patch": ("lark", PATCH_LARK), "ops.code": ("regex", "[A-Z]{2}-[0-9]{3}")}
    shapes = {"functions.apply_patch": PATCH_SHAPE, "ops.code": "[A-Z]{2}-[0-9]{3}"}
    seen = set()
    for tool_names in (("apply_patch",), ("ops.code",), ("apply_patch", "ops.code")):
        constraint = Constraint("required", tool_names, None, {}, grammars)
        for _ in range(3):
            guide = compiler.guide(constraint, 40)
            tokens: list[int] = []
            while not tokens or tokens[-1] not in (200002, 200012):
                token = int(np.argmax(_masked(guide, rng.standard_normal(201088).astype(np.float32))))
                guide.accept(token)
                tokens.append(token)
                assert len(tokens) < 400
            call = reference.parse_messages_from_completion_tokens(tokens, assistant)[-1]
            assert call.recipient in shapes and call.content_type in (None, "")
            assert re.fullmatch(shapes[call.recipient], call.content[0].text), call.content[0].text
            seen.add(call.recipient)
    assert seen == set(shapes)
    # the full Codex grammar (`%import common.LF`, `->` aliases) compiles as a sub-grammar too
    codex = Constraint("any", (), None, {"exec": None}, {"apply_patch": ("lark", CODEX_LARK)})
    assert not codex.is_free and compiler.guide(codex, 64) is not None


CODEX_LARK = (
    'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\n\n'
    "hunk: add_hunk | delete_hunk | update_hunk\n"
    'add_hunk: "*** Add File: " filename LF add_line+\ndelete_hunk: "*** Delete File: " filename LF\n'
    'update_hunk: "*** Update File: " filename LF change_move? change?\n\nfilename: /(.+)/\n'
    'add_line: "+" /(.*)/ LF -> line\n\nchange_move: "*** Move to: " filename LF\n'
    "change: (change_context | change_line)+ eof_line?\n"
    'change_context: ("@@" | "@@ " /(.+)/) LF\nchange_line: ("+" | "-" | " ") /(.*)/ LF\n'
    'eof_line: "*** End of File" LF\n\n%import common.LF\n'
)


def test_a_grammar_compiled_once_is_copied_for_each_generation_of_its_tenant(monkeypatch):
    """The second generation of a tenant's grammar starts from a copy of the first's compiled matcher, at the
    grammar's start however far the first went; another tenant's compiles its own; the kept grammars are bounded
    in number (the least recently used go) and in size (a longer grammar is compiled every time)."""
    compiled = []
    real = grammar_module.llguidance.LLMatcher
    monkeypatch.setattr(grammar_module.llguidance, "LLMatcher", lambda *a, **k: compiled.append(a[1]) or real(*a, **k))
    compiler = GrammarCompiler(load_harmony_encoding(), 201088)
    constraint = Constraint("none", (), VERDICT)
    first = compiler.guide(constraint, 40, "tenant-a")
    start = first.allowed().copy()
    rng = np.random.default_rng(2)
    for _ in range(6):
        first.accept(int(np.argmax(_masked(first, rng.standard_normal(201088).astype(np.float32)))))
    assert not np.array_equal(first.allowed(), start)
    second = compiler.guide(constraint, 40, "tenant-a")
    assert len(compiled) == 1 and np.array_equal(second.allowed(), start)
    compiler.guide(constraint, 40, "tenant-b")
    assert len(compiled) == 2
    monkeypatch.setattr(grammar_module, "KEPT_GRAMMARS", 2)
    for budget in (50, 60):  # other reasoning budgets: other grammars; tenant-a's first is the oldest, then gone
        compiler.guide(constraint, budget, "tenant-a")
    compiler.guide(constraint, 40, "tenant-a")
    assert len(compiled) == 5
    monkeypatch.setattr(grammar_module, "KEPT_GRAMMAR_CHARS", 10)
    compiler.guide(Constraint("none", (), {"type": "object"}), 40, "tenant-a")
    compiler.guide(Constraint("none", (), {"type": "object"}), 40, "tenant-a")
    assert len(compiled) == 7
