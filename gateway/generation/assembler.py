"""The one output assembler: generated token ids → parser events → output items and their events. Items
carry the kinds and id prefixes of the Responses API (the richer of the two: Chat Completions maps them onto a
choice's content, reasoning and tool_calls), so the Responses shape writes them without a second vocabulary.

Analysis becomes a `reasoning` item, `final` and recipient-less `commentary` become `message` items
(the latter flagged as preambles), and any message addressed to a recipient becomes a `function_call`
(`namespace` set when the recipient is one of the client's namespaces), for a freeform tool a
`custom_tool_call`, and for a tool the gateway runs itself its own kind (`web_search_call`,
`code_interpreter_call`, `mcp_call`), which the tool loop executes and settles.
Messages the model wrongly authored as another role are kept as reasoning, never shown as answers.
When logprobs are asked for, each token of an answer message (final channel, or none) carries its own (never
the analysis channel's, nor a preamble's): on the item, and on the text delta it completed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.base import TokenLogprob
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
from harmony.tokens import FIRST_SPECIAL

from ..hosted.results import HostedKind, ToolResult
from ..ids import new_id
from .dialog import Entry
from .logprobs import HeaderTokens, LogprobWriter
from .prompt import FUNCTIONS_PREFIX

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call", "compaction"] | HostedKind
CLIENT_CALL_KINDS = ("function_call", "custom_tool_call")  # calls the client runs
HOSTED_KINDS = ("web_search_call", "code_interpreter_call", "mcp_call", "mcp_list_tools", "mcp_approval_request")
_ID_PREFIX = {
    "reasoning": "rs_",
    "message": "msg_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
    "web_search_call": "ws_",
    "code_interpreter_call": "ci_",
    "mcp_call": "mcp_",
    "mcp_list_tools": "mcpl_",
    "mcp_approval_request": "mcpr_",
    "compaction": "cmp_",
}


@dataclass(frozen=True, slots=True)
class CallRouting:
    """What the request offered beyond `functions`: the client's namespaces, and the freeform tools by recipient."""

    namespaces: frozenset[str] = frozenset()
    freeform: frozenset[str] = frozenset()
    hosted: Mapping[str, HostedKind] = field(default_factory=dict)  # by namespace, or a bare recipient (python)
    approvals: frozenset[str] = frozenset()  # MCP tools (`label.name`) whose calls wait for the client's approval

    def hosted_kind(self, recipient: str) -> HostedKind | None:
        if not self.hosted:
            return None
        if recipient in self.approvals:
            return "mcp_approval_request"
        return self.hosted.get(recipient.partition(".")[0])

    def split(self, recipient: str) -> tuple[str | None, str]:
        """(namespace, name) of a call: a `functions.` call has none; an unknown recipient stays whole."""
        if recipient.startswith(FUNCTIONS_PREFIX):
            return None, recipient.removeprefix(FUNCTIONS_PREFIX)
        namespace, dot, name = recipient.partition(".")
        if dot and (namespace in self.namespaces or namespace in self.hosted):
            return namespace, name
        return None, recipient


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
    channel: str | None = None  # the Harmony channel it was written on
    result: ToolResult | None = None  # a hosted item's, once the loop settled it
    settled: bool = False
    annotations: list[dict[str, Any]] = field(default_factory=list)  # a message's url citations
    logprobs: list[dict[str, Any]] | None = None  # a final answer's tokens' (as the APIs show them), when asked

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def is_call(self) -> bool:
        """A call the client runs."""
        return self.kind in CLIENT_CALL_KINDS

    @property
    def is_hosted(self) -> bool:
        """An item of a tool the gateway runs."""
        return self.kind in HOSTED_KINDS

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
    logprobs: list[dict[str, Any]] | None = None  # the tokens this text completed, when the item carries them


@dataclass(slots=True)
class Closed:
    item: OutputItem


@dataclass(slots=True)
class Executing:
    """The tool loop started running a hosted call."""

    item: OutputItem


@dataclass(slots=True)
class Settled:
    """A hosted item is final: its result (or error) is in `result`."""

    item: OutputItem


ItemEvent = Opened | Delta | Closed | Executing | Settled


def _kind_of(start: MessageStart, routing: CallRouting) -> ItemKind:
    if start.role is not Role.ASSISTANT:
        return "reasoning"
    if start.recipient is not None:
        hosted = routing.hosted_kind(start.recipient)
        if hosted is not None:
            return hosted
        return "custom_tool_call" if start.recipient in routing.freeform else "function_call"
    return "reasoning" if start.channel == "analysis" else "message"


class OutputAssembler:
    """Feed generated token ids; read `items`, token counts and the dialog entries to store. `deltas`: text
    comes as Delta events too (for a stream, or a stop matcher); without them it only joins its item."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        routing: CallRouting | None = None,
        top_logprobs: int | None = None,
        deltas: bool = True,
    ) -> None:
        self._encoding = encoding
        self._deltas = deltas
        self._logprobs = None if top_logprobs is None else LogprobWriter(encoding, top_logprobs)
        self._scored: list[dict[str, Any]] = []  # tokens of the open answer not yet in a delta (partial UTF-8)
        self._header = None if self._logprobs is None else HeaderTokens(encoding, self._logprobs)
        self._parser = StreamParser(encoding, Role.ASSISTANT)
        self._routing = routing or CallRouting()
        self.items: list[OutputItem] = []
        self.entries: list[Entry] = []
        self.output_tokens = 0
        self.reasoning_tokens = 0
        # answer text or calls produced so far (reasoning is not content): what the time to first content
        # token watches for
        self.content_events = 0
        self._open: OutputItem | None = None
        self._tokens_in_message = 0

    @property
    def stop(self) -> StopReason | None:
        return self._parser.stop

    def next_turn(self) -> None:
        """The model continues after a tool's answer: a new parser; items, entries and counts go on."""
        self._parser = StreamParser(self._encoding, Role.ASSISTANT)
        self._open = None
        self._tokens_in_message = 0
        if self._header is not None:
            self._header.clear()

    def add(self, kind: ItemKind, **fields: Any) -> OutputItem:
        """An item the tool loop makes itself (a tool listing, an approval request, an approved call)."""
        item = OutputItem(kind, len(self.items), new_id(_ID_PREFIX[kind]), **fields)
        self.items.append(item)
        return item

    def add_entry(self, entry: Entry) -> None:
        """A message of the dialog that the model did not write (a tool's answer)."""
        self.entries.append(entry)

    def feed(self, tokens: list[int], logprobs: list[TokenLogprob | None] | None = None) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        if self._logprobs is not None and logprobs is not None:
            for position, token in enumerate(tokens):
                self._feed_scored(token, logprobs[position] if position < len(logprobs) else None, events)
            return events
        parse = self._parser.feed_text
        for token in tokens:
            self.output_tokens += 1
            self._tokens_in_message += 1
            produced = parse(token)
            if type(produced) is str:  # most tokens: text of the open item
                if produced:
                    self._text(produced, events)
                continue
            for event in produced:
                if type(event) is ContentDelta:
                    if event.text:
                        self._text(event.text, events)
                else:
                    self._on(event, events)
        return events

    def _text(self, text: str, events: list[ItemEvent]) -> None:
        item = self._open
        if item is not None:
            item.parts.append(text)
            if item.kind != "reasoning":
                self.content_events += 1
            if self._deltas:
                events.append(Delta(item, text))

    def _feed_scored(self, token: int, entry: TokenLogprob | None, events: list[ItemEvent]) -> None:
        """One token with its logprob: kept when it is text of an answer that carries them, or held while a
        header is read (a malformed one may turn out to be text)."""
        assert self._logprobs is not None and self._header is not None
        self.output_tokens += 1
        self._tokens_in_message += 1
        was_open = self._open
        produced = self._parser.feed(token)
        if was_open is None or any(type(event) is MessageEnd for event in produced):
            self._header.add(token, entry)
        elif was_open.logprobs is not None and entry is not None and 0 <= token < FIRST_SPECIAL:
            self._scored.append(self._logprobs.token(token, entry))
        self._emit(produced, events)

    def finish(self) -> list[ItemEvent]:
        """The stream ended: close whatever message was cut off (a header cut off is read as text)."""
        events: list[ItemEvent] = []
        self._emit(self._parser.finish(), events)
        return events

    def _emit(self, produced: Sequence[object], events: list[ItemEvent]) -> None:
        """A token's parser events as item events; an answer's text with the logprobs of the tokens it came from."""
        after_start = opened = False  # text right after a message's start: a header the parser read as text
        for event in produced:
            if type(event) is not ContentDelta:
                after_start = type(event) is MessageStart
                opened = opened or after_start
                self._on(event, events)
                continue
            item = self._open
            if item is None or not event.text:
                continue
            item.parts.append(event.text)
            if item.kind != "reasoning":
                self.content_events += 1
            scored = None
            if item.logprobs is not None and self._header is not None:
                if after_start:
                    scored = self._header.read_as(event.text)
                else:
                    scored, self._scored = self._scored, []
                item.logprobs.extend(scored)
            if self._deltas:
                events.append(Delta(item, event.text, scored))
        if opened and self._header is not None:
            self._header.clear()  # what is left of a header is not text

    def _on(self, event: object, events: list[ItemEvent]) -> None:
        if isinstance(event, MessageStart):
            kind = _kind_of(event, self._routing)
            item = OutputItem(kind, len(self.items), new_id(_ID_PREFIX[kind]), channel=event.channel)
            if item.is_call:
                item.namespace, item.name = self._routing.split(event.recipient or "")
                item.call_id = new_id("call_")
                self.content_events += 1
            elif item.is_hosted:
                item.namespace, item.name = self._routing.split(event.recipient or "")
                item.call_id = item.id  # a stored call's key: an approval names it
                self.content_events += 1
            item.preamble = kind == "message" and event.channel == "commentary"
            if self._logprobs is not None and kind == "message" and not item.preamble:
                item.logprobs = []
            self.items.append(item)
            self._open = item
            events.append(Opened(item))
        elif isinstance(event, MessageEnd):
            item = self._open
            if item is None:
                return
            item.done = True
            item.complete = event.stop is not StopReason.EOS
            if item.logprobs is not None:
                item.logprobs.extend(self._scored)  # a last partial character's tokens
            self._scored = []
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
