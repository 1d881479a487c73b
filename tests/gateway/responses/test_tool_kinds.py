"""Tool kinds beyond `function`, as Codex sends them, through the real `openai` SDK against a live gateway:
namespaces, freeform (custom) tools, hosted tools nothing here runs, client_metadata. Every response and
stream event is validated against the SDK's own pydantic models (the SDK itself only constructs them)."""

from __future__ import annotations

import json

import openai
import pytest
from gateway_fixtures import start_live_gateway
from pydantic import TypeAdapter

MODEL = "gpt-oss-120b"
ANALYSIS_NS = "The user wants the helper agent closed; close_agent does that."
ANALYSIS_PATCH = "I will add notes.txt with apply_patch."
PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+hello\n*** End Patch\n"
LARK = (
    'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\n'
    'hunk: add_hunk\nadd_hunk: "*** Add File: " filename LF add_line+\nfilename: /(.+)/\n'
    'add_line: "+" /(.*)/ LF -> line\n%import common.LF\n'
)
SCRIPT = {
    "rules": [
        {"match": {"tool": "closed"}, "emit": [{"final": "Agent closed."}]},
        {"match": {"tool": "patched"}, "emit": [{"final": "Patched."}]},
        {
            "match": {"user": "close the agent"},
            "emit": [
                {"analysis": ANALYSIS_NS},
                {"tool_call": {"namespace": "multi_agent_v1", "name": "close_agent", "arguments": {"target": "a1"}}},
            ],
        },
        {
            "match": {"user": "add notes"},
            "emit": [{"analysis": ANALYSIS_PATCH}, {"tool_call": {"name": "apply_patch", "input": PATCH}}],
        },
        {"emit": [{"final": "ok"}]},
    ]
}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]},
        }
    ],
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files. This is a FREEFORM tool.",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
RESPONSE = TypeAdapter(openai.types.responses.Response)
EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


@pytest.fixture(params=["memory", "redis"])
def gateway(request, tmp_path):
    live = start_live_gateway(request, tmp_path, SCRIPT)
    yield live
    live.stop()


def _client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=30)


def _validated(response: openai.types.responses.Response) -> openai.types.responses.Response:
    return RESPONSE.validate_python(response.model_dump(by_alias=True, exclude_unset=True))


def _create(api: openai.OpenAI, stream: bool, **body) -> tuple[openai.types.responses.Response, list[str]]:
    """The final response (validated) and, streamed, the event types in order (each event validated)."""
    if not stream:
        return _validated(api.responses.create(model=MODEL, **body)), []
    events = [
        EVENT.validate_python(event.model_dump(by_alias=True, exclude_unset=True))
        for event in api.responses.create(model=MODEL, stream=True, **body)
    ]
    assert events[-1].type == "response.completed"
    return _validated(events[-1].response), [event.type for event in events]


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespace_is_its_own_harmony_namespace_and_its_calls_carry_it(gateway, stream):
    api = _client(gateway)
    first, _ = _create(api, stream, input="close the agent", tools=[EXEC, AGENTS])
    prompt = gateway.backend.prompt_text()
    assert "## multi_agent_v1\n\n// Tools for spawning and managing sub-agents.\nnamespace multi_agent_v1 {" in prompt
    assert "## functions\n\nnamespace functions {\n\n// Runs a command.\ntype exec_command" in prompt
    call = first.output[-1]
    assert (call.type, call.namespace, call.name, json.loads(call.arguments)) == (
        "function_call",
        "multi_agent_v1",
        "close_agent",
        {"target": "a1"},
    )
    replay = [
        {"role": "user", "content": "close the agent"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": "close_agent",
            "namespace": "multi_agent_v1",
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "closed"},
    ]
    second, _ = _create(api, stream, input=replay, tools=[EXEC, AGENTS], store=False)
    assert second.output_text == "Agent closed."
    prompt = gateway.backend.prompt_text()
    assert (
        "<|start|>assistant<|channel|>commentary to=multi_agent_v1.close_agent <|constrain|>json<|message|>" in prompt
    )
    assert "<|start|>multi_agent_v1.close_agent to=assistant<|channel|>commentary<|message|>closed<|end|>" in prompt
    assert ANALYSIS_NS in prompt  # recovered by call id: the client sent no reasoning item


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_takes_raw_text_and_comes_back_as_a_custom_tool_call(gateway, stream):
    api = _client(gateway)
    first, events = _create(
        api, stream, input="add notes", tools=[EXEC, APPLY_PATCH], include=["reasoning.encrypted_content"], store=False
    )
    prompt = gateway.backend.prompt_text()
    assert "// Edit files. This is a FREEFORM tool.\n// This tool's input is raw text, not JSON" in prompt
    assert "// The input must match this lark grammar:\n// start: begin_patch hunk+ end_patch\n" in prompt
    assert "type apply_patch = (_: string) => any;" in prompt
    reasoning, call = first.output
    assert (call.type, call.name, call.input, call.namespace) == ("custom_tool_call", "apply_patch", PATCH, None)
    if stream:
        assert "response.custom_tool_call_input.delta" in events and "response.custom_tool_call_input.done" in events
        assert "response.function_call_arguments.delta" not in events
    replay = [  # as Codex sends it with store: false, the reasoning sealed
        {"role": "user", "content": "add notes"},
        {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "patched"},
    ]
    second, _ = _create(api, stream, input=replay, tools=[EXEC, APPLY_PATCH], store=False)
    assert second.output_text == "Patched."
    prompt = gateway.backend.prompt_text()
    assert f"<|channel|>analysis<|message|>{ANALYSIS_PATCH}<|end|>" in prompt
    assert f"<|start|>assistant<|channel|>commentary to=functions.apply_patch<|message|>{PATCH}<|call|>" in prompt
    assert "<|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>patched<|end|>" in prompt


def test_a_named_custom_tool_choice_is_kept(gateway):
    response = _client(gateway).responses.create(
        model=MODEL, input="add notes", tools=[APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"}
    )
    assert response.status == "completed" and response.output[-1].type == "custom_tool_call"
    assert _validated(response).tool_choice.type == "custom"


def test_hosted_tools_nothing_here_runs_are_not_offered_and_are_reported(gateway, capsys):
    raw = _client(gateway).responses.with_raw_response.create(
        model=MODEL,
        input="hi",
        tools=[
            EXEC,
            {"type": "web_search", "external_web_access": False},
            {"type": "tool_search", "execution": "client", "description": "Searches deferred tools."},
        ],
    )
    assert raw.headers["X-Gateway-Tools-Not-Offered"] == "web_search, tool_search"
    assert _validated(raw.parse()).output_text == "ok"
    prompt = gateway.backend.prompt_text()
    assert "exec_command" in prompt and "web_search" not in prompt and "tool_search" not in prompt
    assert "tools_not_offered" in capsys.readouterr().out


def test_client_metadata_is_stored_with_the_response_and_never_logged(gateway, capsys):
    secret = "turn-metadata-" + "x" * 700  # longer than a metadata value may be: Codex sends ~740 characters
    response = _client(gateway).responses.create(
        model=MODEL, input="hi", extra_body={"client_metadata": {"x-codex-turn": secret}}
    )
    record = gateway.call(gateway.services.store.load("tenant-a", response.id))
    assert record.client_metadata == {"x-codex-turn": secret}
    assert secret not in capsys.readouterr().out


@pytest.mark.parametrize(
    "tools,param",
    [
        (
            [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark", "definition": "start: nowhere"}}],
            "tools[0].format.definition",
        ),
        (
            [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "[a-"}}],
            "tools[0].format.definition",
        ),
        (
            [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}],
            "tools[0].format.syntax",
        ),
        ([EXEC, {**APPLY_PATCH, "name": "exec_command"}], "tools[1].name"),
        ([{**AGENTS, "name": "functions"}], "tools[0].name"),
        ([AGENTS, {**AGENTS, "tools": [{**APPLY_PATCH, "name": "close_agent"}]}], "tools[1].name"),
        ([{**AGENTS, "tools": [EXEC, {**EXEC}]}], "tools[0].tools[1].name"),
        ([{"type": "file_search", "vector_store_ids": []}], "tools[0].type"),
    ],
)
def test_bad_tools_get_a_400_naming_the_parameter(gateway, tools, param):
    with pytest.raises(openai.BadRequestError) as caught:
        _client(gateway).responses.create(model=MODEL, input="hi", tools=tools)
    assert caught.value.body["param"] == param, caught.value.body


def test_replayed_arguments_match_as_json_not_as_text(gateway):
    """Clients that re-serialize the arguments (other key order, spacing) still get the CoT back."""
    api = _client(gateway)
    call = api.responses.create(model=MODEL, input="close the agent", tools=[AGENTS]).output[-1]
    reserialized = json.dumps(json.loads(call.arguments), indent=2)
    assert reserialized != call.arguments
    replay = [
        {"role": "user", "content": "close the agent"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": "close_agent",
            "namespace": "multi_agent_v1",
            "arguments": reserialized,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "closed"},
    ]
    api.responses.create(model=MODEL, input=replay, tools=[AGENTS])
    assert ANALYSIS_NS in gateway.backend.prompt_text()
    replay[1]["arguments"] = json.dumps({"target": "another"})
    api.responses.create(model=MODEL, input=replay, tools=[AGENTS])
    assert ANALYSIS_NS not in gateway.backend.prompt_text()
