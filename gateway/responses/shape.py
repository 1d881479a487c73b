"""The Responses API's output shape in one place: the models of what a response returns (the OpenAPI document
is generated from them), the JSON of each output item, and the response object. The JSON is built directly
(it is on every request's path); tests/gateway/responses/test_shape.py holds every kind of item and response
to what the models dump, so that a field the models do not describe cannot go out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..generation.assembler import OutputItem
from ..generation.turn import Outcome
from ..hosted.results import McpListing, McpResult, NotRun, PythonResult, SearchResult, ToolResult
from .models.items import ReasoningText, SummaryText
from .models.request import ReasoningConfig, ResponsesRequest, TextConfig
from .models.tools import FunctionTool, McpTool

Status = Literal["in_progress", "completed", "incomplete"]
ToolStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class Out(BaseModel):
    """An object the gateway returns: every key it sends is a field here."""

    model_config = ConfigDict(extra="forbid")


class OutputTextOut(Out):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageOut(Out):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status
    phase: Literal["commentary", "final_answer"]
    content: list[OutputTextOut]


class ReasoningOut(Out):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: Status


class FunctionCallOut(Out):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status
    namespace: str | None = None


class CustomToolCallOut(Out):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    namespace: str | None = None


class McpListToolsOut(Out):
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: str
    server_label: str
    tools: list[dict[str, Any]]
    error: dict[str, Any] | str | None = None


class McpApprovalRequestOut(Out):
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str


class McpCallOut(Out):
    type: Literal["mcp_call"] = "mcp_call"
    id: str
    status: ToolStatus
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: dict[str, Any] | str | None = None
    approval_request_id: str | None = None


class WebSearchCallOut(Out):
    type: Literal["web_search_call"] = "web_search_call"
    id: str
    status: ToolStatus
    action: dict[str, Any]


class CodeInterpreterCallOut(Out):
    type: Literal["code_interpreter_call"] = "code_interpreter_call"
    id: str
    status: ToolStatus
    code: str
    container_id: str
    outputs: list[dict[str, Any]] | None = None


class CompactionOut(Out):
    type: Literal["compaction"] = "compaction"
    id: str
    encrypted_content: str


OutputItemOut = Annotated[
    MessageOut
    | ReasoningOut
    | FunctionCallOut
    | CustomToolCallOut
    | McpListToolsOut
    | McpApprovalRequestOut
    | McpCallOut
    | WebSearchCallOut
    | CodeInterpreterCallOut
    | CompactionOut,
    Field(discriminator="type"),
]


class InputTokensDetails(Out):
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # no backend here reports cache writes: 0 (the SDK requires the field)


class OutputTokensDetails(Out):
    reasoning_tokens: int = 0


class Usage(Out):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseErrorOut(Out):
    code: str
    message: str


class IncompleteDetails(Out):
    reason: str


class ConversationOut(Out):
    id: str


class ResponseObject(Out):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    error: ResponseErrorOut | None = None
    incomplete_details: IncompleteDetails | None = None
    background: bool
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    model: str
    output: list[OutputItemOut]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig
    service_tier: str
    store: bool
    temperature: float
    text: TextConfig
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_logprobs: int
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    truncation: str
    usage: Usage | None
    user: str | None
    safety_identifier: str | None
    prompt_cache_key: str | None
    metadata: dict[str, str]
    conversation: ConversationOut | None = None


class InputItemList(Out):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(Out):
    id: str
    object: Literal["response"] = "response"
    deleted: bool


Sealer = Callable[[OutputItem], str | None]  # encrypted_content for a finished reasoning item, or None


def item_json(item: OutputItem, seal: Sealer | None = None, ended: bool = False) -> dict[str, Any]:
    """An output item as the API returns it; in progress until the assembler closed it, or `incomplete` when
    its response `ended` first (cancelled mid-item)."""
    status = "completed" if item.done and item.complete else "incomplete" if item.done or ended else "in_progress"
    if item.kind == "function_call":
        call = {
            "type": "function_call",
            "id": item.id,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.text,
            "status": status,
        }
        return call if item.namespace is None else {**call, "namespace": item.namespace}
    if item.kind == "custom_tool_call":
        call = {
            "type": "custom_tool_call",
            "id": item.id,
            "call_id": item.call_id,
            "name": item.name,
            "input": item.text,
        }
        return call if item.namespace is None else {**call, "namespace": item.namespace}
    if item.is_hosted:
        return _hosted_json(item, status, ended)
    if item.kind == "compaction":  # its text is the sealed summary
        return {"type": "compaction", "id": item.id, "encrypted_content": item.text}
    if item.kind == "reasoning":
        data: dict[str, Any] = {
            "type": "reasoning",
            "id": item.id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": item.text}] if item.done else [],
            "status": status,
        }
        sealed = seal(item) if item.done and seal is not None else None
        if sealed is not None:
            data["encrypted_content"] = sealed
        return data
    return {
        "type": "message",
        "id": item.id,
        "role": "assistant",
        "status": status,
        "phase": "commentary" if item.preamble else "final_answer",
        "content": [text_part(item.text, item.annotations, item.logprobs)] if item.done else [],
    }


def _hosted_json(item: OutputItem, status: str, ended: bool) -> dict[str, Any]:
    """A server-side tool's item: in progress until the loop settled it (or its response `ended`: not run),
    then with its result."""
    result = item.result
    base: dict[str, Any] = {"type": item.kind, "id": item.id}
    if item.kind == "mcp_list_tools":
        tools = result.tools if isinstance(result, McpListing) else []
        return {**base, "server_label": item.namespace, "tools": tools, "error": None}
    if item.kind == "mcp_approval_request":
        return {**base, "server_label": item.namespace, "name": item.name, "arguments": item.text}
    final = _settled_status(result, status) if item.settled else "incomplete" if ended else "in_progress"
    if item.kind == "web_search_call":
        if isinstance(result, SearchResult):
            action = result.action
        else:  # not run, or not yet
            action = {"type": "search", "query": ""} if isinstance(result, NotRun) else {"type": "search"}
        return {**base, "status": final, "action": action}
    if item.kind == "code_interpreter_call":
        logs = result.logs if isinstance(result, PythonResult) and item.settled else None
        return {
            **base,
            "status": final,
            "code": item.text,
            "container_id": (result.container_id if isinstance(result, PythonResult | NotRun) else None) or "",
            "outputs": None if logs is None else [{"type": "logs", "logs": logs}],
        }
    mcp = result if isinstance(result, McpResult) else None
    return {
        **base,
        "status": final,
        "server_label": item.namespace,
        "name": item.name,
        "arguments": item.text,
        "output": mcp.output if mcp else None,
        "error": mcp.error if mcp else None,
        "approval_request_id": mcp.approval_request_id if mcp else None,
    }


def _settled_status(result: ToolResult | None, status: str) -> str:
    if isinstance(result, NotRun):
        return result.status
    return "failed" if result is not None and result.failed else status


def text_part(
    text: str, annotations: list[dict[str, Any]] | None = None, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": logprobs or []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def usage(prompt: int, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    """A response's `usage`, as a Usage dumps it."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


def response_json(
    req: ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    stored: bool,
    conversation_id: str | None,
    outcome: Outcome | None,
    service_tier: str = "default",
) -> dict[str, Any]:
    """The response object at a moment: the request's echo with the output so far (and, once finished, the
    usage). Built as plain JSON on the request path (it runs for every response, and for a stream's every
    lifecycle event); tests/gateway/responses/test_shape.py holds it to what ResponseObject dumps."""
    error = None
    if outcome is not None and outcome.error_code:
        error = _response_error(outcome.error_code, outcome.error_message or "")
    incomplete = {"reason": outcome.incomplete_reason} if outcome and outcome.incomplete_reason else None
    reasoning = req.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "background": req.background,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.effort or "medium", "summary": reasoning.summary},
        "service_tier": service_tier,
        "store": stored,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": _text_echo(req),
        "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump(),
        "tools": [_tool_echo(tool) for tool in req.tools],
        "top_logprobs": req.top_logprobs or 0,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "truncation": req.truncation,
        "usage": usage,
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "metadata": req.metadata or {},
        "conversation": {"id": conversation_id} if conversation_id else None,
    }


def _text_echo(req: ResponsesRequest) -> dict[str, Any]:
    if "text" not in req.model_fields_set:
        return {"format": {"type": "text"}}  # each response its own: a caller may change what it got
    return req.text.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _tool_echo(tool: Any) -> dict[str, Any]:
    """A request's tool as the response echoes it; a function with every field, null where not given (as
    OpenAI returns it and the Open Responses spec requires)."""
    if isinstance(tool, McpTool):
        return tool.echo()
    echo = tool.model_dump(mode="json", exclude_none=True)
    if isinstance(tool, FunctionTool):
        return {"description": None, "parameters": None, "strict": None, **echo}
    return echo


# the codes a response's `error` may carry (the SDK's enum); the gateway's own (constraint_not_enforced,
# server_shutting_down) go as server_error with the specific code leading the message, as the stream's
# `error` event keeps it in its own `code`
RESPONSE_ERROR_CODES = frozenset(
    {"server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout", "invalid_image"}
)


def _response_error(code: str, message: str) -> dict[str, str]:
    if code in RESPONSE_ERROR_CODES:
        return {"code": code, "message": message}
    return {"code": "server_error", "message": f"{code}: {message}"}
