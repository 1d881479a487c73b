"""The one output assembler: generated token ids → parser events → API-neutral output items and events.

Analysis becomes a `reasoning` item, `final` and recipient-less `commentary` become `message` items
(the latter flagged as preambles), and any message addressed to a recipient becomes a `function_call`.
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

ItemKind = Literal["reasoning", "message", "function_call"]
_ID_PREFIX = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


@dataclass(slots=True)
class OutputItem:
    kind: ItemKind
    index: int
    id: str
    preamble: bool = False
    name: str | None = None
    call_id: str | None = None
    parts: list[str] = field(default_factory=list)
    done: bool = False
    complete: bool = True  # False when the stream was cut inside this item (length limit, cancellation)

    @property
    def text(self) -> str:
        return "".join(self.parts)


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


def _kind_of(start: MessageStart) -> ItemKind:
    if start.role is not Role.ASSISTANT:
        return "reasoning"
    if start.recipient is not None:
        return "function_call"
    return "reasoning" if start.channel == "analysis" else "message"


class OutputAssembler:
    """Feed generated token ids; read `items`, token counts and the dialog entries to store."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._parser = StreamParser(encoding, Role.ASSISTANT)
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
            kind = _kind_of(event)
            item = OutputItem(kind, len(self.items), new_id(_ID_PREFIX[kind]))
            if kind == "function_call":
                item.name = (event.recipient or "").removeprefix(FUNCTIONS_PREFIX)
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
