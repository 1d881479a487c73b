"""Responses request → the API-neutral dialog, prompt spec and backend constraint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.base import Constraint
from harmony import ResponseFormat, ToolDescription

from ..conversation import PromptSpec
from ..dialog import Call, CallResult, DialogItem, Entry, Said, Thought
from ..errors import invalid
from ..options import constraint, effort, output_format
from ..sealing import SealError
from ..tenants.limits import TenantLimits, check_caps, json_size
from .models import (
    FunctionCallInput,
    FunctionCallOutputInput,
    MessageInput,
    NamedFunction,
    ReasoningInput,
    Refusal,
    ResponsesRequest,
    TextFormatJsonSchema,
)

Unseal = Callable[[str], str]  # encrypted_content → raw CoT text, raising SealError


def _message_text(item: MessageInput) -> str:
    if isinstance(item.content, str):
        return item.content
    return "".join(part.refusal if isinstance(part, Refusal) else part.text for part in item.content)


def _reasoning_text(item: ReasoningInput, param: str, unseal: Unseal) -> str:
    if item.encrypted_content:
        try:
            return unseal(item.encrypted_content)
        except SealError as exc:
            raise invalid(
                f"{param}.encrypted_content", f"Invalid encrypted_content: {exc}", "invalid_encrypted_content"
            ) from exc
    return "".join(part.text for part in item.content or [])


def to_dialog(request: ResponsesRequest, unseal: Unseal) -> tuple[list[DialogItem], list[str]]:
    """The dialog items, and the texts of system/developer messages (they join the instructions)."""
    if isinstance(request.input, str):
        return [Said("user", request.input, "input")], []
    items: list[DialogItem] = []
    instructions: list[str] = []
    for index, item in enumerate(request.input):
        param = f"input[{index}]"
        if isinstance(item, MessageInput):
            text = _message_text(item)
            if item.role in ("system", "developer"):
                instructions.append(text)
            elif item.role == "user":
                items.append(Said("user", text, param))
            else:
                preamble = None if item.phase is None else item.phase == "commentary"
                items.append(Said("assistant", text, param, preamble))
        elif isinstance(item, ReasoningInput):
            items.append(Thought(_reasoning_text(item, param, unseal), param))
        elif isinstance(item, FunctionCallInput):
            items.append(Call(item.call_id, item.name, item.arguments, param))
        elif isinstance(item, FunctionCallOutputInput):
            output = item.output if isinstance(item.output, str) else "".join(part.text for part in item.output)
            items.append(CallResult(item.call_id, output, param))
    return items, instructions


def _format(request: ResponsesRequest) -> tuple[ResponseFormat | None, dict[str, Any] | None]:
    fmt = request.text.format
    if isinstance(fmt, TextFormatJsonSchema):
        return output_format(fmt.type, fmt.name, fmt.schema_, fmt.description, "text.format.schema")
    return output_format(fmt.type, None, None, None, "text.format.schema")


def constraint_for(request: ResponsesRequest) -> Constraint:
    choice = request.tool_choice
    named = choice.name if isinstance(choice, NamedFunction) else None
    plain = None if isinstance(choice, NamedFunction) else choice
    parameters = {tool.name: tool.parameters for tool in request.tools}
    texts = [(tool.parameters, tool.parameters_json) for tool in request.tools]
    return constraint(parameters, plain, named, _format(request)[1], "tools[{}].parameters", texts)


def prompt_spec(request: ResponsesRequest, history: list[Entry], unseal: Unseal) -> PromptSpec:
    """tool_choice 'none' leaves the tools out of the prompt: the model is not offered what it may not call."""
    items, message_instructions = to_dialog(request, unseal)
    offered = [] if request.tool_choice == "none" else request.tools
    return PromptSpec(
        items=items,
        instructions=[request.instructions or "", *message_instructions],
        history=history,
        tools=[ToolDescription(t.name, t.description or "", t.parameters, t.parameters_json) for t in offered],
        response_format=_format(request)[0],
        effort=effort(request.reasoning.effort),
        truncate=request.truncation == "auto",
    )


def check_tenant_caps(req: ResponsesRequest, limits: TenantLimits) -> None:
    schemas = [(f"tools[{i}].parameters", len(t.parameters_json)) for i, t in enumerate(req.tools) if t.parameters_json]
    if isinstance(req.text.format, TextFormatJsonSchema):
        schemas.append(("text.format.schema", json_size(req.text.format.schema_)))
    items = 1 if isinstance(req.input, str) else len(req.input)
    output = ("max_output_tokens", req.max_output_tokens)
    check_caps(limits, output=output, items=("input", items), tools=("tools", len(req.tools)), schemas=schemas)
