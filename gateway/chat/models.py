"""Pydantic models of the Chat Completions request."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator

from ..generation.options import Effort, ServiceTier
from ..limits import MAX_INPUT_ITEMS, MAX_TOOLS
from ..responses.models.common import Metadata, Strict
from ..responses.models.items import MediaPart
from ..responses.models.tools import SchemaText

MAX_CHOICES = 8
MAX_STOP_SEQUENCES = 4


class TextPart(Strict):
    type: Literal["text"]
    text: str


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


def _part_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "text" if kind == "text" else "media"


TextContent = (
    str
    | list[Annotated[Annotated[TextPart, Tag("text")] | Annotated[MediaPart, Tag("media")], Discriminator(_part_kind)]]
)


class SystemMessage(Strict):
    role: Literal["system", "developer"]
    content: TextContent
    name: str | None = None


class UserMessage(Strict):
    role: Literal["user"]
    content: TextContent
    name: str | None = None


class FunctionCall(Strict):
    name: str = Field(min_length=1, max_length=128)
    arguments: str


class ToolCall(Strict):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(Strict):
    """Also the message object the SDK returns, sent back as is: its null `audio` and `function_call` and its
    `annotations` are accepted (audio and the legacy function_call themselves are not)."""

    role: Literal["assistant"]
    content: str | list[TextPart | RefusalPart] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    refusal: str | None = None
    name: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class ToolMessage(Strict):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, max_length=256)
    content: TextContent


def _role(value: Any) -> str:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return role if role in ("system", "developer", "user", "assistant", "tool") else "unsupported"


class UnsupportedRole(BaseModel):
    """A message whose role is missing or not one of system, developer, user, assistant, tool."""

    role: Any

    @field_validator("role")
    @classmethod
    def _reject_role(cls, role: Any) -> Any:
        raise ValueError(f"role {role!r} is not supported; use system, developer, user, assistant or tool")


ChatMessage = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[SystemMessage, Tag("developer")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolMessage, Tag("tool")]
    | Annotated[UnsupportedRole, Tag("unsupported")],
    Discriminator(_role),
]
CHAT_UNION_TAGS = frozenset(
    {"system", "developer", "user", "assistant", "tool", "unsupported", "text", "refusal", "media"}
)


class FunctionDefinition(Strict, SchemaText):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _has_name(cls, function: dict[str, str]) -> dict[str, str]:
        if set(function) != {"name"}:
            raise ValueError("must be {'name': FUNCTION_NAME}")
        return function


class JsonSchemaSpec(Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class FormatText(Strict):
    type: Literal["text"]


class FormatJsonObject(Strict):
    type: Literal["json_object"]


class FormatJsonSchema(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormatParam = Annotated[FormatText | FormatJsonObject | FormatJsonSchema, Field(discriminator="type")]


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
    tools: Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatParam | None = None
    reasoning_effort: Effort | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    verbosity: Literal["low", "medium", "high"] | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    service_tier: ServiceTier | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    modalities: list[Literal["text"]] | None = None

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if any(not text for text in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stop

    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
