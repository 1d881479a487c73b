"""Responses request → the API-neutral dialog, prompt spec and backend constraint."""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Constraint
from harmony import ReasoningEffort, ResponseFormat, ToolDescription

from .constraints import check_schema
from .conversation import PromptSpec
from .dialog import Call, CallResult, DialogItem, Entry, Said, Thought
from .errors import invalid
from .responses_models import (
    FunctionCallInput,
    FunctionCallOutputInput,
    MessageInput,
    NamedFunction,
    ReasoningInput,
    Refusal,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from .sealing import SealError

Unseal = Callable[[str], str]  # encrypted_content → raw CoT text, raising SealError

JSON_OBJECT_FORMAT = ResponseFormat("json_object", {"type": "object"}, "Answer with one JSON object.")


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


def constraint_for(request: ResponsesRequest) -> Constraint:
    names = tuple(tool.name for tool in request.tools)
    choice = request.tool_choice
    if isinstance(choice, NamedFunction):
        if choice.name not in names:
            raise invalid("tool_choice", f"tool_choice names function '{choice.name}', which is not in tools.")
        tools, names = "required", (choice.name,)
    elif choice == "required":
        if not names:
            raise invalid("tool_choice", "tool_choice 'required' needs at least one tool in tools.")
        tools = "required"
    else:
        tools = "none" if choice == "none" and names else "any"
    text_format = request.text.format
    schema = None
    if isinstance(text_format, TextFormatJsonSchema):
        check_schema(text_format.schema_, "text.format.schema")
        schema = text_format.schema_
    elif isinstance(text_format, TextFormatJsonObject):
        schema = {"type": "object"}
    return Constraint(tools, names if tools == "required" else (), schema)


def _response_format(request: ResponsesRequest) -> ResponseFormat | None:
    text_format = request.text.format
    if isinstance(text_format, TextFormatJsonSchema):
        return ResponseFormat(text_format.name, text_format.schema_, text_format.description)
    if isinstance(text_format, TextFormatJsonObject):
        return JSON_OBJECT_FORMAT
    return None


def _effort(request: ResponsesRequest) -> ReasoningEffort:
    effort = request.reasoning.effort
    if effort is None:
        return ReasoningEffort.MEDIUM
    return ReasoningEffort.LOW if effort == "minimal" else ReasoningEffort(effort)


def prompt_spec(request: ResponsesRequest, history: list[Entry], unseal: Unseal) -> PromptSpec:
    """tool_choice 'none' leaves the tools out of the prompt: the model is not offered what it may not call."""
    items, message_instructions = to_dialog(request, unseal)
    offered = [] if request.tool_choice == "none" else request.tools
    return PromptSpec(
        items=items,
        instructions=[request.instructions or "", *message_instructions],
        history=history,
        tools=[ToolDescription(tool.name, tool.description or "", tool.parameters) for tool in offered],
        response_format=_response_format(request),
        effort=_effort(request),
        truncate=request.truncation == "auto",
    )
