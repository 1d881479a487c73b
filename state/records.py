"""What the stores keep: a response turn and a chain of thought indexed by tool-call id."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from .fast_json import dumps, loads

COMPRESS_ABOVE_BYTES = 4096
_PLAIN, _ZLIB = b"J", b"Z"


class RecordTooLarge(ValueError):
    """A record exceeds the store's size cap."""


@dataclass(slots=True)
class StoredResponse:
    """One turn: the API response object and the Harmony conversation up to and including it."""

    id: str
    tenant: str
    created_at: float
    response: dict[str, Any]  # the API object as returned to the client (status inside)
    conversation: list[dict[str, Any]]  # Harmony messages as plain data, raw CoT included
    input_items: list[dict[str, Any]] = field(default_factory=list)
    client_metadata: dict[str, str] = field(default_factory=dict)  # the request's, kept and never logged


@dataclass(slots=True)
class StoredCot:
    """The CoT of a turn that ended in tool calls, found again by one of the call ids."""

    call_id: str
    tenant: str
    name: str
    arguments: str
    reasoning: list[dict[str, Any]]  # the analysis messages of the turn in progress


def encode(record: StoredResponse | StoredCot, max_bytes: int) -> bytes:
    """JSON, zlib-compressed above a few KiB, with a one-byte format prefix."""
    fields = {name: getattr(record, name) for name in record.__slots__}  # already plain data: no deep copy
    raw = dumps(fields)
    blob = _ZLIB + zlib.compress(raw, 6) if len(raw) > COMPRESS_ABOVE_BYTES else _PLAIN + raw
    if len(blob) > max_bytes:
        raise RecordTooLarge(f"stored record is {len(blob)} bytes; the cap is {max_bytes}")
    return blob


def decode_response(blob: bytes) -> StoredResponse:
    return StoredResponse(**_decode(blob))


def decode_cot(blob: bytes) -> StoredCot:
    return StoredCot(**_decode(blob))


def _decode(blob: bytes) -> dict[str, Any]:
    body = zlib.decompress(blob[1:]) if blob[:1] == _ZLIB else blob[1:]
    return loads(body)


RUNNING = ("queued", "in_progress")
OWNER_STOPPED = "The replica serving this response stopped before it finished; create it again."


def orphaned(record: StoredResponse) -> StoredResponse:
    """A running record whose owner's lease ran out, as every reader sees it: failed."""
    response = {
        **record.response,
        "status": "failed",
        "error": {"code": "server_error", "message": OWNER_STOPPED},
    }
    return StoredResponse(
        record.id,
        record.tenant,
        record.created_at,
        response,
        record.conversation,
        record.input_items,
        record.client_metadata,
    )
