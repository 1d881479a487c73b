"""Responses request → the API-neutral dialog, prompt spec and backend constraint."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from backends.base import Constraint
from harmony import ResponseFormat

from ..encrypted_reasoning import SealError
from ..errors import invalid
from ..generation.dialog import Approval, Call, CallResult, DialogItem, Entry, Instruction, Said, Summary, Thought
from ..generation.options import constraint, effort, output_format, verbosity_instruction
from ..generation.prompt import PromptSpec
from ..hosted.toolset import Toolset
from ..ids import new_id
from ..tenants.limits import TenantLimits, check_caps, json_size
from .models.items import (
    CodeInterpreterCallInput,
    CompactionInput,
    CustomToolCallInput,
    CustomToolCallOutputInput,
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    McpApprovalRequestInput,
    McpApprovalResponseInput,
    McpCallInput,
    McpListToolsInput,
    MessageInput,
    ReasoningInput,
    Refusal,
    WebSearchCallInput,
)
from .models.request import ResponsesRequest, TextFormatJsonSchema
from .models.tools import (
    WEB_SEARCH_KINDS,
    CodeInterpreterTool,
    HostedTool,
    McpTool,
    NamedCustom,
    NamedFunction,
    NamedHosted,
    NamedMcp,
)
from .tools import FUNCTIONS, OfferedTools, offered_tools

Unseal = Callable[[str, str], str]  # (encrypted_content, purpose) → the sealed text, raising SealError
SUMMARY_PURPOSE = "compaction"  # what a compaction item's blob is sealed for (a reasoning item's is "")


def _message_text(item: MessageInput) -> str:
    if isinstance(item.content, str):
        return item.content
    return "".join(part.refusal if isinstance(part, Refusal) else part.text for part in item.content)


def _reasoning_text(item: ReasoningInput, param: str, unseal: Unseal) -> str:
    if item.encrypted_content:
        try:
            return unseal(item.encrypted_content, "")
        except SealError as exc:
            raise invalid(
                f"{param}.encrypted_content", f"Invalid encrypted_content: {exc}", "invalid_encrypted_content"
            ) from exc
    return "".join(part.text for part in item.content or [])


def _summary(item: CompactionInput, param: str, unseal: Unseal) -> str:
    try:
        return unseal(item.encrypted_content, SUMMARY_PURPOSE)
    except SealError as exc:
        raise invalid(
            f"{param}.encrypted_content", f"Invalid compaction item: {exc}", "invalid_encrypted_content"
        ) from exc


def to_dialog(request: ResponsesRequest, unseal: Unseal) -> list[DialogItem]:
    """The dialog items (system and developer messages as instructions, kept by a chain like any item)."""
    if isinstance(request.input, str):
        return [Said("user", request.input, "input")]
    items: list[DialogItem] = []
    for index, item in enumerate(request.input):
        param = f"input[{index}]"
        if isinstance(item, MessageInput):
            text = _message_text(item)
            if item.role in ("system", "developer"):
                items.append(Instruction(text, param))
            elif item.role == "user":
                items.append(Said("user", text, param))
            else:
                preamble = None if item.phase is None else item.phase == "commentary"
                items.append(Said("assistant", text, param, preamble))
        elif isinstance(item, ReasoningInput):
            items.append(Thought(_reasoning_text(item, param, unseal), param))
        elif isinstance(item, FunctionCallInput):
            items.append(Call(item.call_id, item.name, item.arguments, param, item.namespace or FUNCTIONS))
        elif isinstance(item, CustomToolCallInput):
            items.append(Call(item.call_id, item.name, item.input, param, item.namespace or FUNCTIONS, freeform=True))
        elif isinstance(item, FunctionCallOutputInput | CustomToolCallOutputInput):
            output = item.output if isinstance(item.output, str) else "".join(part.text for part in item.output)
            items.append(CallResult(item.call_id, output, param))
        elif isinstance(item, CompactionInput):
            items.append(Summary(_summary(item, param, unseal), param))
        else:
            items.extend(_hosted_items(item, param))
    return items


NOT_KEPT = "[this result was not kept]"


def _hosted_items(item: InputItem, param: str) -> list[DialogItem]:
    """A replayed item of a tool the gateway runs, as the call and answer the model saw."""
    call_id = item.id or new_id("call_")  # type: ignore[union-attr]
    if isinstance(item, McpCallInput):
        output = item.output if item.output is not None else f"error: {item.error}" if item.error else NOT_KEPT
        call = Call(call_id, item.name, item.arguments, param, item.server_label)
        return [call, CallResult(call_id, output, param)]
    if isinstance(item, McpApprovalRequestInput):
        return [Call(call_id, item.name, item.arguments, param, item.server_label)]
    if isinstance(item, McpApprovalResponseInput):
        return [Approval(item.approval_request_id, item.approve, param, item.reason)]
    if isinstance(item, CodeInterpreterCallInput):
        logs = "".join(str(out.get("logs", "")) for out in item.outputs or [] if out.get("type") == "logs")
        call = Call(call_id, "python", item.code or "", param, "", freeform=True, channel="analysis")
        return [call, CallResult(call_id, logs if item.outputs is not None else NOT_KEPT, param)]
    if isinstance(item, WebSearchCallInput):
        action = item.action
        name = {"open_page": "open", "find_in_page": "find"}.get(str(action.get("type")), "search")
        arguments = {key: value for key, value in action.items() if key in ("query", "url", "pattern")}
        if "url" in arguments and name == "open":
            arguments = {"id": arguments["url"]}
        call = Call(call_id, name, json.dumps(arguments), param, "browser", channel="analysis")
        return [call, CallResult(call_id, NOT_KEPT, param)]
    assert isinstance(item, McpListToolsInput)
    return []  # the listing itself is not part of the dialog


_ID_PREFIXES = {
    "mcp_list_tools": "mcpl_",
    "mcp_call": "mcp_",
    "mcp_approval_request": "mcpr_",
    "mcp_approval_response": "mcpa_",
    "web_search_call": "ws_",
    "code_interpreter_call": "ci_",
    "message": "msg_",
    "reasoning": "rs_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
    "compaction": "cmp_",
}


def item_dicts(items: str | list[InputItem]) -> list[dict[str, Any]]:
    """Input items as they are kept and listed (a response's input items, a conversation's items): each with
    an id and a status, a message's text as a content list."""
    if isinstance(items, str):
        content = [{"type": "input_text", "text": items}]
        return [{"type": "message", "id": new_id("msg_"), "role": "user", "content": content, "status": "completed"}]
    out = []
    for item in items:
        data = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        data.setdefault("id", new_id(_ID_PREFIXES[data["type"]]))
        if data["type"] != "compaction":  # a compaction item has no status
            data.setdefault("status", "completed")
        if data["type"] == "message" and isinstance(data.get("content"), str):
            part = "input_text" if data.get("role") != "assistant" else "output_text"
            data["content"] = [{"type": part, "text": data["content"]}]
        out.append(data)
    return out


def _format(request: ResponsesRequest) -> tuple[ResponseFormat | None, dict[str, Any] | None]:
    fmt = request.text.format
    if isinstance(fmt, TextFormatJsonSchema):
        return output_format(fmt.type, fmt.name, fmt.schema_, fmt.description, "text.format.schema")
    return output_format(fmt.type, None, None, None, "text.format.schema")


def constraint_for(request: ResponsesRequest, tools: OfferedTools) -> Constraint:
    """The constraint of the client's own tools; a choice that names or may need the server-side tools
    (whose tool lists come later) is applied by `hosted_tools.with_hosted_tools`."""
    choice = request.tool_choice
    named = choice.name if isinstance(choice, NamedFunction | NamedCustom) else None
    plain = None if isinstance(choice, NamedFunction | NamedCustom) else choice
    if isinstance(choice, NamedMcp | NamedHosted) or (choice == "required" and has_hosted_tools(request)):
        plain = "auto"
    return constraint(tools.parameters, plain, named, _format(request)[1], tools.schemas, tools.grammars)  # type: ignore[arg-type]


def has_hosted_tools(request: ResponsesRequest) -> bool:
    return any(
        isinstance(tool, McpTool | CodeInterpreterTool)
        or (isinstance(tool, HostedTool) and tool.type in WEB_SEARCH_KINDS)
        for tool in request.tools
    )


def prompt_spec(
    request: ResponsesRequest, tools: OfferedTools, history: list[Entry], unseal: Unseal, toolset: Toolset | None = None
) -> PromptSpec:
    """tool_choice 'none' leaves the tools out of the prompt: the model is not offered what it may not call."""
    items = to_dialog(request, unseal)
    offer = request.tool_choice != "none"
    hosted = toolset if offer else None
    return PromptSpec(
        items=items,
        instructions=[request.instructions or "", verbosity_instruction(request.text.verbosity)],
        history=history,
        tools=tools.functions if offer else [],
        namespaces=[*tools.namespaces, *(hosted.namespaces if hosted else [])] if offer else [],
        builtin=hosted.builtin if hosted else [],
        response_format=_format(request)[0],
        effort=effort(request.reasoning.effort),
        truncate=request.truncation == "auto",
    )


def check_tenant_caps(req: ResponsesRequest, tools: OfferedTools, limits: TenantLimits) -> None:
    schemas = [(param, len(text)) for param, _, text in tools.schemas if text]
    if isinstance(req.text.format, TextFormatJsonSchema):
        schemas.append(("text.format.schema", json_size(req.text.format.schema_)))
    items = 1 if isinstance(req.input, str) else len(req.input)
    output = ("max_output_tokens", req.max_output_tokens)
    offered = len(tools.parameters) + len(tools.grammars)
    check_caps(limits, output=output, items=("input", items), tools=("tools", offered), schemas=schemas)


def checked_tools(req: ResponsesRequest, limits: TenantLimits) -> tuple[OfferedTools, Constraint]:
    """The request's tools and output constraint, every schema within the tenant's caps and checked (long for
    a large schema: callers run this off the event loop then)."""
    tools = offered_tools(req)
    check_tenant_caps(req, tools, limits)
    return tools, constraint_for(req, tools)
