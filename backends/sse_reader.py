"""Server-sent events read from an upstream byte stream, with a bound on the size of one event."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


class EventTooLarge(ValueError):
    """An upstream event exceeded the configured size bound."""


@dataclass(frozen=True, slots=True)
class Event:
    field: str  # "data", or "error" (llama.cpp's server sends stream errors as an `error:` field)
    value: str


_FIELDS = ("data", "error")


async def sse_events(chunks: AsyncIterable[bytes], max_event_bytes: int) -> AsyncIterator[Event]:
    """Events in arrival order; lines of one field are joined with newlines; comments and ids are skipped."""
    buffer = bytearray()
    lines: dict[str, list[str]] = {}
    size = 0
    async for chunk in chunks:
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > max_event_bytes:
                    raise EventTooLarge(f"an upstream event is larger than {max_event_bytes} bytes")
                break
            line = bytes(buffer[:end]).rstrip(b"\r").decode("utf-8", "replace")
            del buffer[: end + 1]
            if not line:
                for field, values in lines.items():
                    yield Event(field, "\n".join(values))
                lines.clear()
                size = 0
                continue
            name, _, value = line.partition(":")
            if name not in _FIELDS:
                continue
            size += len(value)
            if size > max_event_bytes:
                raise EventTooLarge(f"an upstream event is larger than {max_event_bytes} bytes")
            lines.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)
    # as the SSE standard says, an event the stream ends in the middle of (no blank line yet) is dropped
