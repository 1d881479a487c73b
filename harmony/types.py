"""Harmony conversation types: roles, authors, messages, system and developer content, tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ReasoningEffort(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


@dataclass(frozen=True, slots=True)
class Author:
    role: Role
    name: str | None = None


@dataclass(slots=True)
class ToolDescription:
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # a JSON Schema; None renders `() => any`
    schema_json: str | None = None  # `parameters` as JSON text when the caller has it: the render cache's key
    freeform: str | None = None  # a tool whose input is raw text, not JSON: what that text must be ("" if free)


@dataclass(slots=True)
class ToolNamespace:
    name: str
    description: str | None = None
    tools: list[ToolDescription] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    valid_channels: tuple[str, ...] = ("analysis", "commentary", "final")
    channel_required: bool = True


DEFAULT_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_KNOWLEDGE_CUTOFF = "2024-06"


@dataclass(slots=True)
class SystemContent:
    model_identity: str | None = DEFAULT_IDENTITY
    reasoning_effort: ReasoningEffort | None = ReasoningEffort.MEDIUM
    knowledge_cutoff: str | None = DEFAULT_KNOWLEDGE_CUTOFF
    conversation_start_date: str | None = None
    channel_config: ChannelConfig | None = field(default_factory=ChannelConfig)
    tools: dict[str, ToolNamespace] | None = None  # built-in tools (browser, python) live here


@dataclass(slots=True)
class ResponseFormat:
    """A structured-output format, rendered in the developer message's `# Response Formats`."""

    name: str
    schema: dict[str, Any]
    description: str | None = None


@dataclass(slots=True)
class DeveloperContent:
    instructions: str | None = None
    tools: dict[str, ToolNamespace] | None = None
    response_formats: list[ResponseFormat] = field(default_factory=list)

    def with_function_tools(self, tools: list[ToolDescription]) -> DeveloperContent:
        namespaces = dict(self.tools or {})
        namespaces["functions"] = ToolNamespace("functions", None, list(tools))
        self.tools = namespaces
        return self


Content = str | SystemContent | DeveloperContent


@dataclass(slots=True)
class Message:
    author: Author
    content: list[Content]
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None

    @classmethod
    def of(
        cls,
        role: Role,
        content: Content | list[Content],
        *,
        name: str | None = None,
        channel: str | None = None,
        recipient: str | None = None,
        content_type: str | None = None,
    ) -> Message:
        parts = content if isinstance(content, list) else [content]
        return cls(Author(role, name), parts, channel, recipient, content_type)

    @property
    def role(self) -> Role:
        return self.author.role

    @property
    def text(self) -> str:
        """The concatenated text parts (system/developer content excluded)."""
        return "".join(part for part in self.content if isinstance(part, str))


@dataclass(slots=True)
class Conversation:
    messages: list[Message] = field(default_factory=list)
