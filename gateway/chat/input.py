"""Chat Completions request → the API-neutral dialog, prompt spec and backend constraint."""

from __future__ import annotations

from backends.base import Constraint
from harmony import ResponseFormat, ToolDescription

from ..generation.dialog import Call, CallResult, DialogItem, Instruction, Said, Thought
from ..generation.options import constraint, effort, output_format, verbosity_instruction
from ..generation.prompt import PromptSpec
from ..tenants.limits import TenantLimits, check_caps, json_size
from .models import AssistantMessage, ChatRequest, FormatJsonSchema, NamedToolChoice, SystemMessage, ToolMessage


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", None) or getattr(part, "refusal", "") for part in content)  # type: ignore[union-attr]


def to_dialog(request: ChatRequest) -> list[DialogItem]:
    """Dialog items (system and developer messages as instructions). Reasoning sent as `reasoning` or
    `reasoning_content` is kept."""
    items: list[DialogItem] = []
    for index, message in enumerate(request.messages):
        param = f"messages[{index}]"
        if isinstance(message, SystemMessage):
            items.append(Instruction(_text(message.content), param))
        elif isinstance(message, ToolMessage):
            items.append(CallResult(message.tool_call_id, _text(message.content), param))
        elif isinstance(message, AssistantMessage):
            reasoning = message.reasoning or message.reasoning_content
            if reasoning:
                items.append(Thought(reasoning, f"{param}.reasoning"))
            text = _text(message.content) or message.refusal or ""
            if text:
                items.append(Said("assistant", text, f"{param}.content", bool(message.tool_calls)))
            for call_index, call in enumerate(message.tool_calls or []):
                call_param = f"{param}.tool_calls[{call_index}]"
                items.append(Call(call.id, call.function.name, call.function.arguments, call_param))
        else:
            items.append(Said("user", _text(message.content), param))
    return items


def _format(request: ChatRequest) -> tuple[ResponseFormat | None, dict | None]:
    fmt = request.response_format
    if isinstance(fmt, FormatJsonSchema):
        spec = fmt.json_schema
        return output_format(fmt.type, spec.name, spec.schema_, spec.description, "response_format.json_schema.schema")
    return output_format(fmt.type if fmt else None, None, None, None, "response_format")


def constraint_for(request: ChatRequest) -> Constraint:
    choice = request.tool_choice
    named = choice.function["name"] if isinstance(choice, NamedToolChoice) else None
    plain = None if isinstance(choice, NamedToolChoice) else choice
    parameters = {tool.function.name: tool.function.parameters for tool in request.tools or []}
    texts = [
        (f"tools[{i}].function.parameters", tool.function.parameters, tool.function.parameters_json)
        for i, tool in enumerate(request.tools or [])
    ]
    return constraint(parameters, plain, named, _format(request)[1], texts)


def prompt_spec(request: ChatRequest) -> PromptSpec:
    offered = [] if request.tool_choice == "none" else request.tools or []
    return PromptSpec(
        items=to_dialog(request),
        instructions=["", verbosity_instruction(request.verbosity)],  # no `instructions` parameter here
        tools=[
            ToolDescription(f.name, f.description or "", f.parameters, f.parameters_json)
            for f in (t.function for t in offered)
        ],
        response_format=_format(request)[0],
        effort=effort(request.reasoning_effort),
    )


def check_tenant_caps(req: ChatRequest, limits: TenantLimits) -> None:
    tools = req.tools or []
    schemas = [
        (f"tools[{i}].function.parameters", len(t.function.parameters_json))
        for i, t in enumerate(tools)
        if t.function.parameters_json
    ]
    if isinstance(req.response_format, FormatJsonSchema):
        schemas.append(("response_format.json_schema.schema", json_size(req.response_format.json_schema.schema_)))
    output = (
        "max_completion_tokens" if req.max_completion_tokens else "max_tokens",
        req.max_completion_tokens or req.max_tokens,
    )
    check_caps(
        limits, output=output, items=("messages", len(req.messages)), tools=("tools", len(tools)), schemas=schemas
    )


def checked_constraint(req: ChatRequest, limits: TenantLimits) -> Constraint:
    """The request's output constraint, every schema within the tenant's caps and checked (long for a large
    schema: callers run this off the event loop then)."""
    check_tenant_caps(req, limits)
    return constraint_for(req)
