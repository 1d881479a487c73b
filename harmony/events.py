"""Events of the streaming parser."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .types import Message, Role


class StopReason(StrEnum):
    END = "end"  # <|end|>: the model goes on with another message
    CALL = "call"  # <|call|>: a tool call, sampling stops
    RETURN = "return"  # <|return|>: the answer is done, sampling stops
    EOS = "eos"  # the token stream ended inside the message (length limit, cancellation)


class RepairKind(StrEnum):
    MISSING_START = "missing_start"
    MISSING_ROLE = "missing_role"
    MISSING_END = "missing_end"
    MISSING_MESSAGE_TOKEN = "missing_message_token"
    REDUNDANT_START = "redundant_start"
    ABANDONED_HEADER = "abandoned_header"
    TRUNCATED_HEADER = "truncated_header"
    HEADER_TOO_LONG = "header_too_long"
    EMPTY_CHANNEL = "empty_channel"
    DUPLICATE_CHANNEL = "duplicate_channel"
    DUPLICATE_RECIPIENT = "duplicate_recipient"
    RECIPIENT_WITHOUT_TO = "recipient_without_to"
    CONTENT_TYPE_WITHOUT_RECIPIENT = "content_type_without_recipient"
    CONSTRAIN_WITHOUT_TYPE = "constrain_without_type"
    EXTRA_HEADER_WORDS = "extra_header_words"
    INVALID_UTF8_IN_HEADER = "invalid_utf8_in_header"
    STRAY_STOP = "stray_stop"
    SPECIAL_IN_CONTENT = "special_in_content"
    SPECIAL_IN_HEADER = "special_in_header"
    UNKNOWN_TOKEN = "unknown_token"
    TOKENS_AFTER_RETURN = "tokens_after_return"
    ENDOFTEXT_AS_RETURN = "endoftext_as_return"
    ROLE_IN_OUTPUT_HEADER = "role_in_output_header"


@dataclass(slots=True)
class MessageStart:
    role: Role
    name: str | None
    channel: str | None
    recipient: str | None
    content_type: str | None


@dataclass(slots=True)
class ContentDelta:
    text: str  # whole characters only


@dataclass(slots=True)
class MessageEnd:
    message: Message
    stop: StopReason


@dataclass(slots=True)
class Repair:
    kind: RepairKind
    detail: str


ParseEvent = MessageStart | ContentDelta | MessageEnd | Repair
