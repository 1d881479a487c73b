"""The API-neutral conversation both skins translate into: what was said, thought, called and returned.

Each item keeps `param`, the request path it came from, so errors can name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from harmony import Author, Message, Role

Speaker = Literal["user", "assistant"]


@dataclass(slots=True)
class Said:
    role: Speaker
    text: str
    param: str
    preamble: bool | None = None  # None: decided by position (followed by a tool call in the same turn)


@dataclass(slots=True)
class Thought:
    text: str
    param: str


@dataclass(slots=True)
class Call:
    """A tool call; `arguments` is JSON text, or the raw input of a freeform (custom) tool."""

    call_id: str
    name: str
    arguments: str
    param: str
    namespace: str = "functions"  # "" for a bare recipient (python)
    freeform: bool = False
    channel: str = "commentary"  # analysis for the built-in tools

    @property
    def recipient(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    @property
    def qualified_name(self) -> str:
        """As OutputItem.qualified_name: bare in `functions`, `ns.name` in a client namespace."""
        return self.name if self.namespace == "functions" else self.recipient


@dataclass(slots=True)
class CallResult:
    call_id: str
    output: str
    param: str


@dataclass(slots=True)
class Approval:
    """The client's answer to an approval request of a call the gateway runs (an MCP tool's)."""

    request_id: str
    approve: bool
    param: str
    reason: str | None = None


@dataclass(slots=True)
class Instruction:
    """A system or developer message of the input: it joins the developer message's instructions wherever it
    stands, and a chain keeps it for its later turns (as a stateless client re-sends it)."""

    text: str
    param: str


@dataclass(slots=True)
class Summary:
    """A compaction's summary of the turns before it (written by the model, opened from its sealed item)."""

    text: str
    param: str


DialogItem = Said | Thought | Call | CallResult | Approval | Summary | Instruction


@dataclass(slots=True)
class Entry:
    """A Harmony message of the stored dialog; tool calls keep the call id the API gave them."""

    message: Message
    call_id: str | None = None

    def to_data(self) -> dict[str, Any]:
        m = self.message
        data: dict[str, Any] = {"role": m.author.role.value, "text": m.text}
        if m.author.name is not None:
            data["name"] = m.author.name
        if m.channel is not None:
            data["channel"] = m.channel
        if m.recipient is not None:
            data["recipient"] = m.recipient
        if m.content_type is not None:
            data["content_type"] = m.content_type
        if self.call_id is not None:
            data["call_id"] = self.call_id
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Entry:
        message = Message(
            Author(Role(data["role"]), data.get("name")),
            [data["text"]],
            data.get("channel"),
            data.get("recipient"),
            data.get("content_type"),
        )
        return cls(message, data.get("call_id"))
