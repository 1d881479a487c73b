"""What a remote token server's stream says, whatever its dialect: a step per event, or a reported error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .base import GenerateRequest, TokenLogprob


@dataclass(slots=True)
class Step:
    tokens: list[int]  # tokens new in this event
    finished: bool = False  # the server says the generation is over
    stop_token: int | None = None  # the stop token the server says it matched (appended when not sent)
    cached_tokens: int | None = None
    logprobs: list[TokenLogprob | None] | None = None  # one per token of `tokens`, when asked and given


class UpstreamReported(Exception):
    """The server reported an error in its stream; the message is the server's, shortened."""


class UpstreamProtocolError(Exception):
    """The server's stream does not follow its documented format."""


class Dialect(Protocol):
    """One server protocol: where to POST, the JSON body, and how to read one streamed event."""

    name: str
    path: str
    logprobs: bool  # whether it asks the server for logprobs when the request wants them
    constraints: bool  # whether the server enforces GenerateRequest.constraint while it samples
    prefix_cache: bool  # whether a prompt sent ahead (a prewarm) is kept for the request that continues it
    publishes_pages: bool  # whether its servers stream the page names they hold (the built-in engine's)
    service_tiers: bool  # whether the server schedules by the request's service tier (it is sent)

    def body(self, request: GenerateRequest, model: str | None) -> dict[str, Any]: ...

    def step(self, payload: dict[str, Any], received: int) -> Step:
        """`received`: tokens this stream has already delivered (for servers that resend them)."""
        ...


MAX_REPORTED_CHARS = 300


def error_text(error: Any) -> str:
    """A server's error object or string, as one short line."""
    message = error.get("message") if isinstance(error, dict) else error
    text = " ".join(str(message or "unspecified error").split())
    return text if len(text) <= MAX_REPORTED_CHARS else text[: MAX_REPORTED_CHARS - 1] + "…"


def raise_reported(payload: dict[str, Any]) -> None:
    if payload.get("error"):
        raise UpstreamReported(error_text(payload["error"]))


def token_ids(value: Any, field: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
        raise UpstreamProtocolError(f"'{field}' is not a list of token ids")
    return value


def count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None
