"""The tools a Responses request offers and its `tool_choice`."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from ...intake.json_schemas import schema_text
from ...limits import (
    MAX_GRAMMAR_CHARS,
    MAX_NAMESPACE_DESCRIPTION_CHARS,
    MAX_TOOLS,
)
from .common import Strict, type_of


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
    return "custom_tool" if type_of(value) == "custom" else "function_tool"


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
    kind = type_of(value)
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
    those OpenAI's tool_choice takes; the web search tool's own types (`web_search`, ...) are the same choice,
    named as tool_choice names it (the SDK's ToolChoiceTypes has no other)."""

    type: Literal[
        "code_interpreter", "web_search_preview", "web_search_preview_2025_03_11", "web_search", "web_search_2025_08_26"
    ]

    @model_validator(mode="after")
    def _as_tool_choice_names_it(self) -> NamedHosted:
        if self.type in ("web_search", "web_search_2025_08_26"):
            self.type = "web_search_preview"
        return self


ToolChoice = (
    Literal["auto", "none", "required"]
    | Annotated[NamedFunction | NamedCustom | NamedMcp | NamedHosted, Field(discriminator="type")]
)
