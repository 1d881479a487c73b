"""Pydantic models of the Responses API: the request we accept and the objects we return."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from ..json_schemas import schema_text
from ..limits import (
    MAX_INPUT_ITEMS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
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


ContentPart = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]


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


class FunctionCallInput(Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputInput(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if kind in _ITEM_KINDS else "unsupported"


class UnsupportedItem(BaseModel):
    type: str

    @field_validator("type")
    @classmethod
    def _reject(cls, kind: str) -> str:
        raise ValueError(
            f"input item type '{kind}' is not supported; use message, reasoning, function_call or function_call_output"
        )


_ITEM_KINDS = ("message", "reasoning", "function_call", "function_call_output")
UNION_TAGS = frozenset({*_ITEM_KINDS, "unsupported", "input_text", "output_text", "refusal"})
InputItem = Annotated[
    Annotated[MessageInput, Tag("message")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
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


class FunctionTool(Strict, SchemaText):
    type: str
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("type")
    @classmethod
    def _functions_only(cls, kind: str) -> str:
        if kind != "function":
            raise ValueError(f"tool type '{kind}' is not supported; only 'function' tools are")
        return kind


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedFunction


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
    effort: Literal["minimal", "low", "medium", "high"] | None = None
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


class ResponsesRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)] = Field(default_factory=list)
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    max_output_tokens: int | None = Field(default=None, ge=16)
    max_tool_calls: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    metadata: Metadata | None = None
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool = False
    previous_response_id: str | None = Field(default=None, max_length=256)
    include: list[str] = Field(default_factory=list)
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] = "disabled"

    @field_validator("include")
    @classmethod
    def _known_includes(cls, include: list[str]) -> list[str]:
        for value in include:
            if value not in INCLUDABLE:
                raise ValueError(f"'{value}' is not one of {', '.join(INCLUDABLE)}")
        return include


# ---- output --------------------------------------------------------------------------------------


class OutputTextOut(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageOut(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputTextOut]


class ReasoningOut(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"]


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[MessageOut | ReasoningOut | FunctionCallOut, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseErrorOut(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: str


class ResponseObject(BaseModel):
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
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig
    service_tier: str
    store: bool
    temperature: float
    text: TextConfig
    tool_choice: ToolChoice
    tools: list[FunctionTool]
    top_logprobs: int
    top_p: float
    truncation: str
    usage: Usage | None
    user: str | None
    safety_identifier: str | None
    prompt_cache_key: str | None
    metadata: dict[str, str]


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool
