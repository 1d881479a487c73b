"""Streaming Harmony parser for untrusted model output: never raises, reports what it repaired."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .encoding import HarmonyEncoding, load_harmony_encoding
from .events import ContentDelta, MessageEnd, MessageStart, ParseEvent, Repair, RepairKind, StopReason
from .header import HeaderFields
from .tokens import (
    CALL,
    CHANNEL,
    END,
    ENDOFTEXT,
    FIRST_SPECIAL,
    MESSAGE,
    RETURN,
    SPECIAL_TEXT,
    START,
)
from .types import Message, Role

EXPECT_START, HEADER, CONTENT = 0, 1, 2
MAX_HEADER_TOKENS = 64
_STOPS = {END: StopReason.END, CALL: StopReason.CALL, RETURN: StopReason.RETURN}
_NOTHING: tuple[ParseEvent, ...] = ()
_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class StreamParser:
    """Feed token ids one at a time; each call returns the events it completed.

    `role` is the author the output starts with (the prompt ended in `<|start|>assistant`); None
    when the stream starts with `<|start|>` (e.g. parsing a rendered conversation).
    """

    def __init__(self, encoding: HarmonyEncoding | None = None, role: Role | None = Role.ASSISTANT) -> None:
        encoding = encoding or load_harmony_encoding()
        self._table = encoding.token_bytes
        self._headers = encoding.headers
        self._vocab_size = len(self._table)
        self._default_role = role or Role.ASSISTANT
        self.messages: list[Message] = []
        self.repairs: list[Repair] = []
        self.stop: StopReason | None = None  # the last stop token seen
        self._after_return = False
        self._after_return_reported = False
        self._header: list[int] = []
        self._explicit_start = role is None
        self._state = HEADER if role is not None else EXPECT_START
        self._fields: HeaderFields | None = None
        self._parts: list[str] = []
        self._whole = encoding.whole_texts
        self._decoder = _Utf8Decoder(errors="replace")

    def feed(self, token: int) -> Sequence[ParseEvent]:
        produced = self.feed_text(token)
        if type(produced) is str:
            return (ContentDelta(produced),) if produced else _NOTHING
        return produced

    def feed_text(self, token: int) -> str | Sequence[ParseEvent]:
        """`feed`, except that a token of a message's text gives the text itself (maybe "", a partial character)
        rather than a ContentDelta of it: the path most tokens of an answer take, with nothing made for them."""
        if self._state == CONTENT and 0 <= token < FIRST_SPECIAL:
            text = self._text(token)
            if text:
                self._parts.append(text)
            return text
        return self._feed_other(token)

    def _text(self, token: int) -> str:
        """The characters a text token completes: with no partial character held, a token whose bytes are whole
        UTF-8 decodes as it did before (the encoding's cache); else through the incremental decoder."""
        decoder = self._decoder
        if decoder.buffer:
            return decoder.decode(self._table[token])
        text = self._whole.get(token)
        if text is None:
            text = decoder.decode(self._table[token])
            if not decoder.buffer:  # nothing held back: the bytes were whole (or replaced whole)
                self._whole[token] = text
        return text

    def _feed_other(self, token: int) -> Sequence[ParseEvent]:
        events: list[ParseEvent] = []
        if not 0 <= token < self._vocab_size:
            self._repair(events, RepairKind.UNKNOWN_TOKEN, f"skipped token id {token} outside the vocabulary")
        elif self._state == CONTENT:
            self._special_in_content(token, events)
        elif self._state == HEADER:
            self._in_header(token, events)
        else:
            self._expecting_start(token, events)
        return events

    def feed_all(self, tokens: Iterable[int]) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        for token in tokens:
            events += self.feed(token)
        return events

    def finish(self) -> list[ParseEvent]:
        """End of the token stream: close an open message (stop reason EOS)."""
        events: list[ParseEvent] = []
        if self._state == CONTENT:
            self._end_message(StopReason.EOS, events)
        elif self._state == HEADER and self._header:
            fields = self._parse(message_token_missing=True)
            if fields.fallback_content:
                self._repair(events, RepairKind.MISSING_MESSAGE_TOKEN, "header text read as content")
                self._open_message(fields, events)
                self._end_message(StopReason.EOS, events)
            else:
                self._repair(events, RepairKind.TRUNCATED_HEADER, "the stream ended inside a message header")
        self._header = []
        self._state = EXPECT_START
        return events

    # -- states -------------------------------------------------------------------------------

    def _special_in_content(self, token: int, events: list[ParseEvent]) -> None:
        stop = _STOPS.get(token)
        if stop is not None:
            self._end_message(stop, events)
        elif token == ENDOFTEXT:
            self._repair(events, RepairKind.ENDOFTEXT_AS_RETURN, "<|endoftext|> ended the message")
            self._end_message(StopReason.RETURN, events)
        elif token == START:
            self._repair(events, RepairKind.MISSING_END, "<|start|> inside content ended the message")
            self._end_message(StopReason.END, events)
            self._begin_header(explicit=True)
        elif token == CHANNEL:
            self._repair(events, RepairKind.MISSING_END, "<|channel|> inside content began a new message")
            self._end_message(StopReason.END, events)
            self._begin_header(explicit=False)
            self._header.append(token)
        else:
            self._repair(events, RepairKind.SPECIAL_IN_CONTENT, f"dropped {SPECIAL_TEXT[token]} from content")

    def _in_header(self, token: int, events: list[ParseEvent]) -> None:
        if token == MESSAGE:
            self._open_message(self._parse(), events)
        elif token in _STOPS or token == ENDOFTEXT:
            fields = self._parse(message_token_missing=True)
            self._repair(events, RepairKind.MISSING_MESSAGE_TOKEN, "a stop token ended the header")
            self._open_message(fields, events)
            self._end_message(_STOPS.get(token, StopReason.RETURN), events)
        elif token == START:
            if self._header:
                self._repair(events, RepairKind.ABANDONED_HEADER, "<|start|> inside a header; began again")
            else:
                self._repair(events, RepairKind.REDUNDANT_START, "ignored a repeated <|start|>")
            self._begin_header(explicit=True)
        else:
            self._header.append(token)
            if len(self._header) > MAX_HEADER_TOKENS:
                fields = self._parse(message_token_missing=True)
                self._repair(events, RepairKind.HEADER_TOO_LONG, "no <|message|> after a long header")
                self._open_message(fields, events)

    def _expecting_start(self, token: int, events: list[ParseEvent]) -> None:
        if token == START:
            self._after_return = False
            self._begin_header(explicit=True)
        elif self._after_return:
            if not self._after_return_reported:  # once per <|return|>, however many tokens follow it
                self._after_return_reported = True
                self._repair(events, RepairKind.TOKENS_AFTER_RETURN, "ignored output after <|return|>")
        elif token in _STOPS:
            self.stop = _STOPS[token]
            self._after_return = token == RETURN
            self._after_return_reported = False
            self._repair(events, RepairKind.STRAY_STOP, f"{SPECIAL_TEXT[token]} outside a message")
        elif token == MESSAGE:
            self._repair(events, RepairKind.MISSING_START, "<|message|> without a header")
            self._begin_header(explicit=False)
            self._open_message(self._parse(), events)
        elif token == CHANNEL or token < FIRST_SPECIAL:
            self._begin_header(explicit=False)
            self._header.append(token)
            self._repair(events, RepairKind.MISSING_START, "a message began without <|start|>")
        else:
            self._repair(events, RepairKind.SPECIAL_IN_HEADER, f"ignored {SPECIAL_TEXT[token]} between messages")

    # -- helpers ------------------------------------------------------------------------------

    def _repair(self, events: list[ParseEvent], kind: RepairKind, detail: str) -> None:
        repair = Repair(kind, detail)
        self.repairs.append(repair)
        events.append(repair)

    def _begin_header(self, explicit: bool) -> None:
        self._state = HEADER
        self._header = []
        self._explicit_start = explicit

    def _parse(self, message_token_missing: bool = False) -> HeaderFields:
        return self._headers.parse(
            self._header,
            explicit_start=self._explicit_start,
            default_role=self._default_role,
            message_token_missing=message_token_missing,
        )

    def _open_message(self, fields: HeaderFields, events: list[ParseEvent]) -> None:
        for repair in fields.repairs:
            self.repairs.append(repair)
            events.append(repair)
        self._fields = fields
        self._state = CONTENT
        self._header = []
        self._parts = []
        self._decoder = _Utf8Decoder(errors="replace")
        author = fields.author
        events.append(MessageStart(author.role, author.name, fields.channel, fields.recipient, fields.content_type))
        if fields.fallback_content:
            self._parts.append(fields.fallback_content)
            events.append(ContentDelta(fields.fallback_content))

    def _end_message(self, stop: StopReason, events: list[ParseEvent]) -> None:
        tail = self._decoder.decode(b"", True)
        if tail:
            self._parts.append(tail)
            events.append(ContentDelta(tail))
        fields = self._fields
        assert fields is not None
        message = Message(fields.author, ["".join(self._parts)], fields.channel, fields.recipient, fields.content_type)
        self.messages.append(message)
        events.append(MessageEnd(message, stop))
        self.stop = stop
        self._after_return = stop is StopReason.RETURN
        self._after_return_reported = False
        self._state = EXPECT_START
        self._fields = None
        self._parts = []


@dataclass(slots=True)
class ParsedCompletion:
    messages: list[Message]
    repairs: list[Repair] = field(default_factory=list)
    stop: StopReason | None = None


def parse_completion(
    tokens: Iterable[int], role: Role | None = Role.ASSISTANT, encoding: HarmonyEncoding | None = None
) -> ParsedCompletion:
    """Parse a whole completion (or, with role=None, a rendered conversation) into messages."""
    parser = StreamParser(encoding, role)
    parser.feed_all(tokens)
    parser.finish()
    return ParsedCompletion(parser.messages, parser.repairs, parser.stop)
