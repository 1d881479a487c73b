"""Lenient parsing of a message header (the tokens between `<|start|>` and `<|message|>`).

Grammar accepted: `[role[:name]] [to=R] [<|channel|>channel [to=R] [type]] [<|constrain|>type]`,
with the recipient allowed in the role part or the channel part. Deviations are repaired and
reported, never raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .events import Repair, RepairKind
from .tokens import CHANNEL, CONSTRAIN, FIRST_SPECIAL, SPECIAL_TEXT
from .types import Author, Role

CONSTRAIN_TEXT = "<|constrain|>"
HEADER_CACHE_LIMIT = 4096
_WORD = re.compile(r"\S+")
_ROLES = {r.value: r for r in Role}
_RECIPIENT_PREFIXES = ("functions.", "browser.", "container.", "python", "assistant")


def _looks_like_recipient(word: str) -> bool:
    """`functions.get_weather`, `browser.search`, `python`: a recipient, not a content type like `json`."""
    return word.startswith(_RECIPIENT_PREFIXES)


@dataclass(frozen=True, slots=True)
class HeaderFields:
    author: Author
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    fallback_content: str = ""  # header text that is really content (when <|message|> was missing)
    repairs: list[Repair] = field(default_factory=list)


def _segments(tokens: list[int], table: list[bytes], repairs: list[Repair]) -> list[int | str]:
    """Header tokens as text runs and the markers CHANNEL / CONSTRAIN."""
    out: list[int | str] = []
    run: list[bytes] = []

    def flush() -> None:
        if run:
            raw = b"".join(run)
            text = raw.decode("utf-8", errors="replace")
            if "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", errors="ignore"):
                repairs.append(Repair(RepairKind.INVALID_UTF8_IN_HEADER, "replaced undecodable header bytes"))
            out.append(text)
            run.clear()

    for token in tokens:
        if token in (CHANNEL, CONSTRAIN):
            flush()
            out.append(token)
        elif token >= FIRST_SPECIAL:
            repairs.append(Repair(RepairKind.SPECIAL_IN_HEADER, f"ignored {SPECIAL_TEXT[token]} in header"))
        else:
            run.append(table[token])
    flush()
    return out


def _author_of(word: str) -> Author | None:
    role_text, colon, name = word.partition(":")
    role = _ROLES.get(role_text)
    if role is None:
        return None
    return Author(role, name if colon else None)


def parse_header(
    tokens: list[int],
    table: list[bytes],
    *,
    explicit_start: bool,
    default_role: Role,
    message_token_missing: bool = False,
) -> HeaderFields:
    """Fields of a header. With `explicit_start` the first word names the author (a role, or a tool's
    name for tool output); otherwise a leading known role word is accepted and `default_role` used.
    With `message_token_missing`, the first word that is not a header field starts the content."""
    repairs: list[Repair] = []
    segments = _segments(tokens, table, repairs)
    author: Author | None = None
    role_pending = True
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    after_channel = after_constrain = False
    channel_markers = 0
    extras: list[str] = []
    fallback: list[str] = []
    undecodable_reported = bool(repairs)  # _segments reports invalid bytes; a literal U+FFFD is reported below

    for segment in segments:
        if fallback:
            fallback.append(SPECIAL_TEXT[segment] if isinstance(segment, int) else segment)
            continue
        if segment == CHANNEL:
            channel_markers += 1
            if channel_markers > 1:
                repairs.append(Repair(RepairKind.DUPLICATE_CHANNEL, "several <|channel|> markers; the last wins"))
            after_channel, after_constrain, role_pending = True, False, False
            continue
        if segment == CONSTRAIN:
            if content_type is not None:
                repairs.append(Repair(RepairKind.EXTRA_HEADER_WORDS, f"dropped content type {content_type!r}"))
            content_type = CONSTRAIN_TEXT
            after_constrain, role_pending = True, False
            continue
        assert isinstance(segment, str)
        for match in _WORD.finditer(segment):
            word = match.group()
            if "\ufffd" in word and not message_token_missing:
                if not undecodable_reported:
                    repairs.append(Repair(RepairKind.INVALID_UTF8_IN_HEADER, f"dropped header word {word!r}"))
                    undecodable_reported = True
                continue
            if role_pending:
                role_pending = False
                candidate = _author_of(word)
                if candidate is None and explicit_start and not word.startswith("to="):
                    candidate = Author(Role.TOOL, word)
                if candidate is not None and not explicit_start and candidate.role is not default_role:
                    repairs.append(  # output continuing a turn cannot change who speaks
                        Repair(
                            RepairKind.ROLE_IN_OUTPUT_HEADER, f"ignored role word {word!r}; kept {default_role.value}"
                        )
                    )
                    continue
                if candidate is not None:
                    author = candidate
                    continue
            if after_channel and not word.startswith("to="):  # a to= may precede the channel word
                channel, after_channel = word, False
                continue
            if word.startswith("to="):
                target = word[3:]
                if recipient is None and target:
                    recipient = target
                elif target and target != recipient:
                    repairs.append(Repair(RepairKind.DUPLICATE_RECIPIENT, f"kept recipient {recipient!r}"))
                else:
                    repairs.append(Repair(RepairKind.DUPLICATE_RECIPIENT, "ignored a repeated or empty to="))
                continue
            if after_constrain:
                content_type, after_constrain = CONSTRAIN_TEXT + word, False
                continue
            if message_token_missing:
                fallback.append(segment[match.start() :])  # later segments follow via the loop head
                break
            extras.append(word)
        role_pending = False

    if author is None:
        author = Author(default_role)
        if explicit_start:
            repairs.append(Repair(RepairKind.MISSING_ROLE, f"header had no role; used {default_role.value}"))
    if after_channel:
        repairs.append(Repair(RepairKind.EMPTY_CHANNEL, "<|channel|> without a channel name"))
    if content_type == CONSTRAIN_TEXT:
        repairs.append(Repair(RepairKind.CONSTRAIN_WITHOUT_TYPE, "<|constrain|> without a type"))
    if extras:
        if recipient is None and (len(extras) >= 2 or content_type is not None or _looks_like_recipient(extras[0])):
            recipient = extras.pop(0)
            repairs.append(Repair(RepairKind.RECIPIENT_WITHOUT_TO, f"read {recipient!r} as the recipient"))
        if extras and content_type is None:
            content_type = extras.pop(0)
        if extras:
            repairs.append(Repair(RepairKind.EXTRA_HEADER_WORDS, f"ignored {len(extras)} header word(s)"))
    if content_type is not None and recipient is None:
        repairs.append(
            Repair(RepairKind.CONTENT_TYPE_WITHOUT_RECIPIENT, f"content type {content_type!r} without a recipient")
        )
    return HeaderFields(author, channel, recipient, content_type, "".join(fallback).lstrip(), repairs)


class HeaderCache:
    """Parsed headers of one vocabulary, by their tokens and flags: a model writes the same few headers over and
    over. Only headers read without a repair are kept (their fields are frozen and shared), at most
    HEADER_CACHE_LIMIT of them: unusual headers are parsed each time."""

    def __init__(self, table: list[bytes]) -> None:
        self._table = table
        self._parsed: dict[tuple[Any, ...], HeaderFields] = {}

    def parse(
        self, tokens: list[int], *, explicit_start: bool, default_role: Role, message_token_missing: bool = False
    ) -> HeaderFields:
        key = (tuple(tokens), explicit_start, default_role, message_token_missing)
        found = self._parsed.get(key)
        if found is not None:
            return found
        fields = parse_header(
            tokens,
            self._table,
            explicit_start=explicit_start,
            default_role=default_role,
            message_token_missing=message_token_missing,
        )
        if not fields.repairs and len(self._parsed) < HEADER_CACHE_LIMIT:
            self._parsed[key] = fields
        return fields
