"""Pydantic models of the Responses API request: its input items, tools and options (what a response
returns is in shape.py)."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from ..generation.options import Effort, ServiceTier
from ..json_schemas import schema_text
from ..limits import (
    MAX_CLIENT_METADATA_CHARS,
    MAX_GRAMMAR_CHARS,
    MAX_INPUT_ITEMS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAMESPACE_DESCRIPTION_CHARS,
    MAX_SEALED_CHARS,
    MAX_TOOLS,
)


def _bounded_metadata(metadata: dict[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(
                f"keys are at most {MAX_METADATA_KEY_CHARS} characters and values {MAX_METADATA_VALUE_CHARS}"
            )
    return metadata


Metadata = Annotated[dict[str, str], AfterValidator(_bounded_metadata)]  # OpenAI's limits, shared by both APIs


def _bounded_client_metadata(metadata: dict[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
    if sum(len(key) + len(value) for key, value in metadata.items()) > MAX_CLIENT_METADATA_CHARS:
        raise ValueError(f"keys and values come to at most {MAX_CLIENT_METADATA_CHARS} characters in all")
    return metadata


# what a client (Codex: its turn metadata) attaches for itself: stored with the response, never logged
ClientMetadata = Annotated[dict[str, str], AfterValidator(_bounded_client_metadata)]


def _type_of(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


class Strict(BaseModel):
    """Unknown fields are rejected with a 400 naming them, as OpenAI does."""

    model_config = ConfigDict(extra="forbid", strict=True)


# ---- input items -------------------------------------------------------------------------------


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
    kind = _type_of(value)
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


# ---- tools, tool choice, text format, reasoning --------------------------------------------------


class SchemaText:
    """For a function model of either API: its `parameters` as schema_text, made once per request (size
    caps, schema check, render cache)."""

    @functools.cached_property
    def parameters_json(self) -> str | None:
        parameters: dict[str, Any] | None = getattr(self, "parameters")  # noqa: B009 - the model's field
        return None if parameters is None else schema_text(parameters)


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class FunctionTool(Strict, SchemaText):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class CustomFormat(Strict):
    """`{"type": "text"}` (any text) or `{"type": "grammar", "syntax": "lark" | "regex", "definition": ...}`."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = Field(default=None, min_length=1, max_length=MAX_GRAMMAR_CHARS)

    @model_validator(mode="after")
    def _grammar_is_whole(self) -> CustomFormat:
        if self.type == "grammar" and (self.syntax is None or self.definition is None):
            raise ValueError("a grammar format needs 'syntax' and 'definition'")
        return self

    @property
    def grammar(self) -> tuple[str, str]:
        """(syntax, definition); ("", "") for free text."""
        if self.type == "grammar" and self.syntax is not None and self.definition is not None:
            return self.syntax, self.definition
        return "", ""


class CustomTool(Strict):
    """A freeform tool: the model writes its input as raw text (held to `format`'s grammar where enforced)."""

    type: Literal["custom"]
    name: ToolName
    description: str | None = None
    format: CustomFormat = Field(default_factory=lambda: CustomFormat(type="text"))
    defer_loading: bool | None = None


def _member_kind(value: Any) -> str:
    return "custom_tool" if _type_of(value) == "custom" else "function_tool"


NamespacedTool = Annotated[
    Annotated[FunctionTool, Tag("function_tool")] | Annotated[CustomTool, Tag("custom_tool")],
    Discriminator(_member_kind),
]
RESERVED_NAMESPACES = frozenset({"functions", "browser", "python", "container", "multi_tool_use"})


class NamespaceTool(Strict):
    """Tools the model calls as `NAME.tool`: rendered as their own Harmony namespace."""

    type: Literal["namespace"]
    name: ToolName
    description: str = Field(max_length=MAX_NAMESPACE_DESCRIPTION_CHARS)
    tools: Annotated[list[NamespacedTool], Field(min_length=1, max_length=MAX_TOOLS)]

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_NAMESPACES:
            raise ValueError(f"namespace '{name}' is reserved by the Harmony format")
        return name


WEB_SEARCH_KINDS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
NOT_OFFERED_KINDS = (*WEB_SEARCH_KINDS, "tool_search")


class HostedTool(BaseModel):
    """Web search (run as Harmony's browser when a search provider is configured) or tool search: what
    nothing here runs is not offered to the model, and the response says so (a header and a log line),
    rather than failing the client's request."""

    type: Literal[NOT_OFFERED_KINDS]  # type: ignore[valid-type]
    model_config = ConfigDict(extra="allow")


class McpToolFilter(Strict):
    tool_names: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=MAX_TOOLS)
    read_only: bool | None = None


class McpApprovalFilter(Strict):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(Strict):
    """A remote MCP server the gateway calls for the model; `headers` and `authorization` are used for the
    calls and never stored, echoed or logged."""

    type: Literal["mcp"]
    server_label: ToolName
    server_url: str | None = Field(default=None, min_length=1, max_length=2048)
    headers: dict[str, Annotated[str, Field(max_length=8192)]] | None = Field(default=None, max_length=32)
    authorization: str | None = Field(default=None, max_length=8192)
    allowed_tools: list[Annotated[str, Field(max_length=128)]] | McpToolFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = Field(default=None, max_length=MAX_NAMESPACE_DESCRIPTION_CHARS)
    connector_id: str | None = None
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None

    @field_validator("server_label")
    @classmethod
    def _not_reserved(cls, label: str) -> str:
        if label in RESERVED_NAMESPACES:
            raise ValueError(f"server_label '{label}' is reserved by the Harmony format")
        return label

    @model_validator(mode="after")
    def _has_url(self) -> McpTool:
        if self.connector_id is not None:
            raise ValueError("connectors are OpenAI's hosted services; give a server_url instead")
        if self.server_url is None:
            raise ValueError("server_url is required")
        return self

    def echo(self) -> dict[str, Any]:
        """As the response shows it: without its secrets."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"headers", "authorization"})


class CodeInterpreterContainer(Strict):
    type: Literal["auto"]
    file_ids: list[str] | None = None
    memory_limit: str | None = None


class CodeInterpreterTool(Strict):
    """Harmony's python tool, run in the gateway's sandbox (when the operator enabled it)."""

    type: Literal["code_interpreter"]
    container: Annotated[str, Field(min_length=1, max_length=256)] | CodeInterpreterContainer
    allowed_callers: list[str] | None = None

    @field_validator("container")
    @classmethod
    def _no_files(cls, container: str | CodeInterpreterContainer) -> str | CodeInterpreterContainer:
        if isinstance(container, CodeInterpreterContainer) and container.file_ids:
            raise ValueError("files cannot be uploaded to this gateway's sandbox (file_ids)")
        return container


class UnsupportedTool(BaseModel):
    type: str

    @field_validator("type")
    @classmethod
    def _reject(cls, kind: str) -> str:
        raise ValueError(
            f"tool type '{kind}' is not supported; use function, custom, namespace, mcp, code_interpreter, "
            "web_search or tool_search"
        )


def _tool_kind(value: Any) -> str:
    kind = _type_of(value)
    if kind in ("function", "custom", "namespace", "mcp", "code_interpreter"):
        return f"{kind}_tool"
    return "hosted_tool" if kind in NOT_OFFERED_KINDS else "unsupported_tool"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function_tool")]
    | Annotated[CustomTool, Tag("custom_tool")]
    | Annotated[NamespaceTool, Tag("namespace_tool")]
    | Annotated[McpTool, Tag("mcp_tool")]
    | Annotated[CodeInterpreterTool, Tag("code_interpreter_tool")]
    | Annotated[HostedTool, Tag("hosted_tool")]
    | Annotated[UnsupportedTool, Tag("unsupported_tool")],
    Discriminator(_tool_kind),
]
TOOL_TAGS = frozenset(
    {"function_tool", "custom_tool", "namespace_tool", "mcp_tool", "code_interpreter_tool", "hosted_tool"}
    | {"unsupported_tool"}
)


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class NamedCustom(Strict):
    type: Literal["custom"]
    name: str


class NamedMcp(Strict):
    """Force a call to this MCP server (to its tool `name`, when given)."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class NamedHosted(Strict):
    """Force a call to a built-in tool the gateway runs: python, or the browser (web search). The types are
    those OpenAI's tool_choice takes (`web_search` is a tool's type there, not a tool choice's)."""

    type: Literal["code_interpreter", "web_search_preview", "web_search_preview_2025_03_11"]


ToolChoice = (
    Literal["auto", "none", "required"]
    | Annotated[NamedFunction | NamedCustom | NamedMcp | NamedHosted, Field(discriminator="type")]
)


class TextFormatText(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(Strict):
    format: TextFormat = Field(default_factory=lambda: TextFormatText(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Strict):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


INCLUDABLE = (
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)


class StreamOptions(Strict):
    include_obfuscation: bool | None = None


REQUEST_TAGS = UNION_TAGS | TOOL_TAGS


class ContextManagement(Strict):
    """Compact the conversation before answering when its prompt passes `compact_threshold` tokens."""

    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=1)


class ConversationRef(Strict):
    id: str = Field(min_length=1, max_length=256)


class ResponsesRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)] = Field(default_factory=list)
    instructions: str | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    max_output_tokens: int | None = Field(default=None, ge=16)
    max_tool_calls: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    metadata: Metadata | None = None
    client_metadata: ClientMetadata | None = None
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool = False
    previous_response_id: str | None = Field(default=None, max_length=256)
    conversation: Annotated[str, Field(min_length=1, max_length=256)] | ConversationRef | None = None
    include: list[str] = Field(default_factory=list)
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    service_tier: ServiceTier | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    context_management: list[ContextManagement] | None = Field(default=None, max_length=1)

    @property
    def conversation_id(self) -> str | None:
        conversation = self.conversation
        return conversation.id if isinstance(conversation, ConversationRef) else conversation

    @field_validator("include")
    @classmethod
    def _known_includes(cls, include: list[str]) -> list[str]:
        for value in include:
            if value not in INCLUDABLE:
                raise ValueError(f"'{value}' is not one of {', '.join(INCLUDABLE)}")
        return include


class CompactRequest(Strict):
    """`POST /v1/responses/compact`: the conversation to compact, as a create would take it."""

    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # accepted; the engine's cache is its own
    service_tier: ServiceTier | None = None
