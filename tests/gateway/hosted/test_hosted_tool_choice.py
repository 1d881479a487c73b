"""`tool_choice` naming a server-side tool (`mcp`, `code_interpreter`, `web_search`) or `required` with them,
through the real `openai` SDK: accepted as OpenAI accepts it, a 400 naming the parameter when what it names is
not offered, checked after the fact on a backend that cannot enforce it (the scripted mock), and held for the
first sampling of a response only (the call it forced is made; the loop then answers freely)."""

from __future__ import annotations

import openai
import pytest
from hosted_gateway import EVENT, MODEL, PYTHON_TOOL, SEARCH_TOOL, client, create, mcp_tool, of

NEVER = {"require_approval": "never"}
TERMINAL_ITEM_STATUSES = ("completed", "incomplete", "failed")


@pytest.mark.parametrize(
    ("choice", "tools", "text", "kind"),
    [
        ({"type": "code_interpreter"}, "python", "compute the answer", "code_interpreter_call"),
        ({"type": "web_search_preview"}, "search", "search for tides", "web_search_call"),
        ({"type": "web_search_preview_2025_03_11"}, "search", "search for tides", "web_search_call"),
        ({"type": "web_search"}, "search", "search for tides", "web_search_call"),  # the tool's type: the same
        ({"type": "mcp", "server_label": "calc"}, "mcp", "add two numbers", "mcp_call"),
        ({"type": "mcp", "server_label": "calc", "name": "add"}, "mcp", "add two numbers", "mcp_call"),
        ("required", "python", "compute the answer", "code_interpreter_call"),
        ("required", "all", "add two numbers", "mcp_call"),
    ],
)
def test_a_tool_choice_that_forces_a_server_side_tool_runs_it(memory_gateway, mcp_server, choice, tools, text, kind):
    offered = {
        "python": [PYTHON_TOOL],
        "search": [SEARCH_TOOL],
        "mcp": [mcp_tool(mcp_server, **NEVER)],
        "all": [PYTHON_TOOL, SEARCH_TOOL, mcp_tool(mcp_server, **NEVER)],
    }[tools]
    response, _ = create(client(memory_gateway), False, input=text, tools=offered, tool_choice=choice)
    assert response.status == "completed", response.error
    assert of(response, kind) and of(response, kind)[0].status == "completed"
    echoed = response.tool_choice
    named = (
        choice if isinstance(choice, str) else {"web_search": "web_search_preview"}.get(choice["type"], choice["type"])
    )
    assert (echoed if isinstance(echoed, str) else echoed.type) == named  # the web search tool's type as tool_choice


def test_a_forced_server_side_tool_the_model_did_not_call_fails_honestly(memory_gateway, mcp_server):
    """The mock cannot enforce the choice: answering without the forced call fails the response, as for
    functions; a call to another server-side tool than the one named fails it too."""
    api = client(memory_gateway)
    answered, _ = create(api, False, input="hello", tools=[PYTHON_TOOL], tool_choice={"type": "code_interpreter"})
    assert answered.status == "failed" and "constraint_not_enforced" in answered.error.message
    tools = [PYTHON_TOOL, mcp_tool(mcp_server, **NEVER)]
    other, _ = create(
        api, False, input="compute the answer", tools=tools, tool_choice={"type": "mcp", "server_label": "calc"}
    )
    assert other.status == "failed" and "'python'" in other.error.message


@pytest.mark.parametrize(
    ("choice", "tools", "param"),
    [
        ({"type": "code_interpreter"}, [], "tool_choice"),
        ({"type": "web_search_preview"}, [PYTHON_TOOL], "tool_choice"),
        ({"type": "mcp", "server_label": "elsewhere"}, ["mcp"], "tool_choice.server_label"),
        ({"type": "mcp", "server_label": "calc", "name": "divide"}, ["mcp"], "tool_choice.name"),
        ("required", [], "tool_choice"),
    ],
)
def test_a_tool_choice_naming_what_is_not_offered_is_a_400_naming_it(memory_gateway, mcp_server, choice, tools, param):
    offered = [mcp_tool(mcp_server, **NEVER) if tool == "mcp" else tool for tool in tools]
    with pytest.raises(openai.BadRequestError) as refused:
        client(memory_gateway).responses.create(model="gpt-oss-120b", input="hi", tools=offered, tool_choice=choice)
    assert refused.value.body["param"] == param, refused.value.body


def test_a_forced_choice_holds_for_the_first_sampling_only(memory_gateway):
    """'required' with python: the forced call runs, and the model then answers (it is not forced to call
    python again until max_tool_calls)."""
    response, _ = create(
        client(memory_gateway), False, input="compute the answer", tools=[PYTHON_TOOL], tool_choice="required"
    )
    assert response.status == "completed" and response.output_text == "The answer is 42."
    assert len(of(response, "code_interpreter_call")) == 1


def test_a_failed_response_ends_its_unrun_call_in_a_terminal_status_everywhere(memory_gateway, mcp_server):
    """tool_choice names the MCP server and the model calls python: the response fails, python is not run, and
    its call is `incomplete` in the response, in the streamed `response.output_item.done`, and in a later GET."""
    api = client(memory_gateway)
    body = {
        "input": "compute the answer",
        "tools": [PYTHON_TOOL, mcp_tool(mcp_server, **NEVER)],
        "tool_choice": {"type": "mcp", "server_label": "calc"},
    }
    failed, _ = create(api, False, **body)
    events = [EVENT.validate_python(e.model_dump()) for e in api.responses.create(model=MODEL, stream=True, **body)]
    streamed = events[-1].response
    assert failed.status == streamed.status == "failed" and events[-1].type == "response.failed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    for output in (failed.output, streamed.output, api.responses.retrieve(failed.id).output, done):
        (call,) = [item for item in output if item.type == "code_interpreter_call"]
        assert call.status == "incomplete" and call.outputs is None  # not run
        assert all(getattr(item, "status", "completed") in TERMINAL_ITEM_STATUSES for item in output)
    assert not [e for e in events if e.type == "response.code_interpreter_call.interpreting"]
