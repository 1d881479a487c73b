"""The response JSON the gateway builds by hand is exactly what its output models would dump: every kind of item,
in progress and settled, every echo of the request and every outcome."""

from __future__ import annotations

import json

import pytest

from gateway.generation.assembler import OutputItem
from gateway.generation.turn import Outcome
from gateway.hosted.results import McpListing, McpResult, NotRun, PythonResult, SearchResult
from gateway.responses.models.request import ResponsesRequest
from gateway.responses.shape import ResponseObject, item_json, response_json, usage

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}
REQUESTS = [
    {"model": "gpt-oss-120b", "input": "hi"},
    {
        "model": "gpt-oss-120b",
        "input": "hi",
        "instructions": "Be brief.",
        "temperature": 1,
        "top_p": 0.5,
        "presence_penalty": 1,
        "frequency_penalty": -0.5,
        "max_output_tokens": 64,
        "max_tool_calls": 2,
        "metadata": {"team": "a"},
        "reasoning": {"effort": "high", "summary": "auto"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
        "tools": [
            {"type": "function", "name": "ping"},
            {"type": "function", "name": "add", "parameters": SCHEMA, "strict": True, "description": "Adds."},
            {"type": "custom", "name": "patch"},
        ],
        "tool_choice": {"type": "function", "name": "ping"},
        "user": "u-1",
        "safety_identifier": "s-1",
        "prompt_cache_key": "k-1",
        "top_logprobs": 3,
        "truncation": "auto",
    },
    {"model": "gpt-oss-120b", "input": "hi", "text": {"verbosity": "low"}, "tool_choice": "required"},
]


def _item(kind: str, index: int, **fields) -> OutputItem:
    return OutputItem(kind, index, f"item_{index}", **fields)  # type: ignore[arg-type]


def _items() -> list[OutputItem]:
    done = {"done": True, "parts": ["text"]}
    settled = {"settled": True, "done": True}
    search = SearchResult({"type": "search", "query": "q"}, False)
    return [
        _item("reasoning", 0, **done),
        _item("reasoning", 1),  # still being written
        _item("message", 2, **done, annotations=[{"type": "url_citation", "url": "https://a.example"}]),
        _item("message", 3, preamble=True, done=True, parts=["a"], logprobs=[{"token": "a", "logprob": -0.1}]),
        _item("message", 4, done=True, complete=False, parts=["cut"]),
        _item("function_call", 5, name="ping", call_id="call_1", **done),
        _item("function_call", 6, name="f", namespace="ns", call_id="call_2", **done),
        _item("custom_tool_call", 7, name="patch", call_id="call_3", **done),
        _item("compaction", 8, **done),
        _item("web_search_call", 9, **settled, result=search),
        _item("web_search_call", 10, done=True),
        _item("code_interpreter_call", 11, **settled, parts=["print(1)"], result=PythonResult("c1", "1\n", False)),
        _item("code_interpreter_call", 12, **settled, result=NotRun("incomplete", "c1")),
        _item("mcp_list_tools", 13, namespace="srv", settled=True, result=McpListing([{"name": "t"}])),
        _item("mcp_approval_request", 14, namespace="srv", name="t", **done),
        _item("mcp_call", 15, namespace="srv", name="t", settled=True, result=McpResult("out", None, "apr_1"), **done),
        _item("mcp_call", 16, namespace="srv", name="t", settled=True, result=McpResult(None, {"type": "x"}), **done),
    ]


OUTCOMES = [
    ("completed", Outcome("completed")),
    ("incomplete", Outcome("incomplete", incomplete_reason="max_output_tokens")),
    ("failed", Outcome("failed", error_code="server_error", error_message="The model backend failed.")),
    ("failed", Outcome("failed", error_code="server_shutting_down", error_message="Cut.")),
    ("in_progress", None),
]


@pytest.mark.parametrize("body", REQUESTS, ids=["plain", "every-option", "text-and-choice"])
@pytest.mark.parametrize(("status", "outcome"), OUTCOMES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(OUTCOMES)])
def test_the_built_json_is_what_the_models_dump(body, status, outcome):
    request = ResponsesRequest.model_validate(body)
    finished = status != "in_progress"
    built = response_json(
        request,
        response_id="resp_1",
        created_at=1_700_000_000,
        status=status,
        output=[item_json(item, lambda item: "sealed", ended=finished) for item in _items()],
        usage=usage(10, 4, 7, 3) if finished else None,
        stored=True,
        conversation_id="conv_1" if body is REQUESTS[1] else None,
        outcome=outcome,
    )
    dumped = ResponseObject.model_validate(built).model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert json.loads(json.dumps(built)) == dumped
    assert [type(value) for value in built.values()] == [type(value) for value in dumped.values()]


def test_a_key_the_models_do_not_describe_fails_the_check():
    built = response_json(
        ResponsesRequest.model_validate(REQUESTS[0]),
        response_id="resp_1",
        created_at=1,
        status="completed",
        output=[{**item_json(_items()[2]), "surprise": 1}],
        usage=usage(1, 0, 1, 0),
        stored=False,
        conversation_id=None,
        outcome=Outcome("completed"),
    )
    with pytest.raises(ValueError, match="surprise"):
        ResponseObject.model_validate(built)
