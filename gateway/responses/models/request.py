"""The Responses create and compact request bodies, with their text format, reasoning and other options."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from ...generation.options import Effort, ServiceTier
from ...limits import (
    MAX_INPUT_ITEMS,
    MAX_TOOLS,
)
from .common import ClientMetadata, Metadata, Strict
from .items import UNION_TAGS, InputItem
from .tools import TOOL_TAGS, Tool, ToolChoice


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
