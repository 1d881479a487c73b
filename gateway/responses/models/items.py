"""The input items of a Responses request (messages, calls and their outputs, replayed tool items,
compaction), as the API's reference groups them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from ...limits import (
    MAX_SEALED_CHARS,
)
from .common import Strict, type_of


class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class MediaPart(BaseModel):
    """An image, audio or file content part, in either API: gpt-oss reads text only, so a 400 that says so."""

    type: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        raise ValueError(f"gpt-oss reads text only: '{kind}' content parts are not supported; send text")


def _content_kind(value: Any) -> str:
    kind = type_of(value)
    return kind if kind in ("input_text", "output_text", "refusal") else "media"


ContentPart = Annotated[
    Annotated[InputText, Tag("input_text")]
    | Annotated[OutputText, Tag("output_text")]
    | Annotated[Refusal, Tag("refusal")]
    | Annotated[MediaPart, Tag("media")],
    Discriminator(_content_kind),
]


class MessageInput(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningInput(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class _CallInput(Strict):
    """What a replayed call of either kind carries besides its type and its arguments or input."""

    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    namespace: str | None = Field(default=None, max_length=64)
    id: str | None = None
    status: str | None = None


class FunctionCallInput(_CallInput):
    type: Literal["function_call"]
    arguments: str


class CustomToolCallInput(_CallInput):
    type: Literal["custom_tool_call"]
    input: str


class FunctionCallOutputInput(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputInput(FunctionCallOutputInput):
    type: Literal["custom_tool_call_output"]  # type: ignore[assignment]


class Replayed(BaseModel):
    """An output item of a server-side tool sent back as input: read for what the prompt needs; fields the
    gateway does not use are let through (a client replays whatever it received)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = Field(default=None, max_length=256)
    status: str | None = None


class McpListToolsInput(Replayed):
    type: Literal["mcp_list_tools"]
    server_label: str = Field(max_length=64)
    tools: list[Any] = Field(default_factory=list)
    error: str | None = None


class _McpCallFields(Replayed):
    """What a replayed MCP call and approval request both carry."""

    server_label: str = Field(max_length=64)
    name: str = Field(min_length=1, max_length=128)
    arguments: str


class McpCallInput(_McpCallFields):
    type: Literal["mcp_call"]
    output: str | None = None
    error: Any = None
    approval_request_id: str | None = None


class McpApprovalRequestInput(_McpCallFields):
    type: Literal["mcp_approval_request"]


class McpApprovalResponseInput(Strict):
    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(min_length=1, max_length=256)
    approve: bool
    reason: str | None = Field(default=None, max_length=4096)
    id: str | None = None


class WebSearchCallInput(Replayed):
    type: Literal["web_search_call"]
    action: dict[str, Any] = Field(default_factory=dict)


class CodeInterpreterCallInput(Replayed):
    type: Literal["code_interpreter_call"]
    code: str | None = None
    container_id: str | None = None
    outputs: list[dict[str, Any]] | None = None


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if kind in _ITEM_KINDS else "unsupported"


class CompactionInput(Strict):
    """A compaction item `/v1/responses/compact` (or a create's context_management) returned: its summary of
    the earlier conversation, sealed for this tenant."""

    type: Literal["compaction"]
    encrypted_content: str = Field(min_length=1, max_length=MAX_SEALED_CHARS)
    id: str | None = Field(default=None, max_length=256)
    created_by: str | None = Field(default=None, max_length=256)


class UnsupportedItem(BaseModel):
    type: str

    @field_validator("type")
    @classmethod
    def _reject(cls, kind: str) -> str:
        raise ValueError(
            f"input item type '{kind}' is not supported; use {', '.join(_ITEM_KINDS[:-1])} or {_ITEM_KINDS[-1]}"
        )


_ITEM_KINDS = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
    "web_search_call",
    "code_interpreter_call",
    "compaction",
)
UNION_TAGS = frozenset({*_ITEM_KINDS, "unsupported", "input_text", "output_text", "refusal", "media"})
InputItem = Annotated[
    Annotated[MessageInput, Tag("message")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
    | Annotated[CustomToolCallInput, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputInput, Tag("custom_tool_call_output")]
    | Annotated[McpListToolsInput, Tag("mcp_list_tools")]
    | Annotated[McpCallInput, Tag("mcp_call")]
    | Annotated[McpApprovalRequestInput, Tag("mcp_approval_request")]
    | Annotated[McpApprovalResponseInput, Tag("mcp_approval_response")]
    | Annotated[WebSearchCallInput, Tag("web_search_call")]
    | Annotated[CodeInterpreterCallInput, Tag("code_interpreter_call")]
    | Annotated[CompactionInput, Tag("compaction")]
    | Annotated[UnsupportedItem, Tag("unsupported")],
    Discriminator(_item_kind),
]
