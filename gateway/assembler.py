"""The one output assembler: generated token ids → parser events → API-neutral output items and events.

Analysis becomes a `reasoning` item, `final` and recipient-less `commentary` become `message` items
(the latter flagged as preambles), and any message addressed to a recipient becomes a `function_call`
(`namespace` set when the recipient is one of the client's namespaces) or, for a freeform tool, a
`custom_tool_call`.
Messages the model wrongly authored as another role are kept as reasoning, never shown as answers.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Literal

from harmony import (
    ContentDelta,
    HarmonyEncoding,
    Message,
    MessageEnd,
    MessageStart,
    Role,
    StopReason,
    StreamParser,
)

from .conversation import FUNCTIONS_PREFIX
from .dialog import Entry

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call"]
CALL_KINDS = ("function_call", "custom_tool_call")
_ID_PREFIX = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_", "custom_tool_call": "ctc_"}


@dataclass(frozen=True, slots=True)
class CallRouting:
    """What the request offered beyond `functions`: the client's namespaces, and the freeform tools by recipient."""

    namespaces: frozenset[str] = frozenset()
    freeform: frozenset[str] = frozenset()

    def split(self, recipient: str) -> tuple[str | None, str]:
        """(namespace, name) of a call: a `functions.` call has none; an unknown recipient stays whole."""
        if recipient.startswith(FUNCTIONS_PREFIX):
            return None, recipient.removeprefix(FUNCTIONS_PREFIX)
        namespace, dot, name = recipient.partition(".")
        if dot and namespace in self.namespaces:
            return namespace, name
        return None, recipient


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


@dataclass(slots=True)
class OutputItem:
    kind: ItemKind
    index: int
    id: str
    preamble: bool = False
    name: str | None = None
    namespace: str | None = None  # a call into one of the client's namespaces
    call_id: str | None = None
    parts: list[str] = field(default_factory=list)
    done: bool = False
    complete: bool = True  # False when the stream was cut inside this item (length limit, cancellation)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def is_call(self) -> bool:
        return self.kind in CALL_KINDS

    @property
    def qualified_name(self) -> str | None:
        """The name a constraint knows a call by: `ns.name` inside a client namespace."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name


@dataclass(slots=True)
class Opened:
    item: OutputItem


@dataclass(slots=True)
class Delta:
    item: OutputItem
    text: str


@dataclass(slots=True)
class Closed:
    item: OutputItem


ItemEvent = Opened | Delta | Closed


def _kind_of(start: MessageStart, routing: CallRouting) -> ItemKind:
    if start.role is not Role.ASSISTANT:
        return "reasoning"
    if start.recipient is not None:
        return "custom_tool_call" if start.recipient in routing.freeform else "function_call"
    return "reasoning" if start.channel == "analysis" else "message"


class OutputAssembler:
    """Feed generated token ids; read `items`, token counts and the dialog entries to store."""

    def __init__(self, encoding: HarmonyEncoding, routing: CallRouting | None = None) -> None:
        self._parser = StreamParser(encoding, Role.ASSISTANT)
        self._routing = routing or CallRouting()
        self.items: list[OutputItem] = []
        self.entries: list[Entry] = []
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self._open: OutputItem | None = None
        self._tokens_in_message = 0

    @property
    def stop(self) -> StopReason | None:
        return self._parser.stop

    def feed(self, tokens: list[int]) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        for token in tokens:
            self.output_tokens += 1
            self._tokens_in_message += 1
            for event in self._parser.feed(token):
                self._on(event, events)
        return events

    def finish(self) -> list[ItemEvent]:
        """The stream ended: close whatever message was cut off."""
        events: list[ItemEvent] = []
        for event in self._parser.finish():
            self._on(event, events)
        return events

    def _on(self, event: object, events: list[ItemEvent]) -> None:
        if isinstance(event, ContentDelta):
            if self._open is not None and event.text:
                self._open.parts.append(event.text)
                events.append(Delta(self._open, event.text))
        elif isinstance(event, MessageStart):
            kind = _kind_of(event, self._routing)
            item = OutputItem(kind, len(self.items), new_id(_ID_PREFIX[kind]))
            if item.is_call:
                item.namespace, item.name = self._routing.split(event.recipient or "")
                item.call_id = new_id("call_")
            item.preamble = kind == "message" and event.channel == "commentary"
            self.items.append(item)
            self._open = item
            events.append(Opened(item))
        elif isinstance(event, MessageEnd):
            item = self._open
            if item is None:
                return
            item.done = True
            item.complete = event.stop is not StopReason.EOS
            if item.kind == "reasoning":
                self.reasoning_tokens += self._tokens_in_message
            self._tokens_in_message = 0
            self.entries.append(Entry(self._stored(item, event.message), item.call_id))
            self._open = None
            events.append(Closed(item))

    @staticmethod
    def _stored(item: OutputItem, message: Message) -> Message:
        if item.kind == "reasoning" and (message.role is not Role.ASSISTANT or message.channel != "analysis"):
            return Message.of(Role.ASSISTANT, item.text, channel="analysis")
        return message
