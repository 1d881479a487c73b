"""Streaming a background response again: `GET /v1/responses/{id}?stream=true&starting_after=N` replays its
kept events after N and follows it while it runs, on whichever replica the request reaches. When the record
is finished but its last event never arrived (the replica running it died), the stream ends with the
record's own terminal event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from state import StoredResponse, StoreUnavailable

from ..errors import invalid
from ..services import Services
from ..sse import ClientGone, end_stream, frame, open_stream, pump

TERMINAL_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
TERMINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")
WAIT_S = 1.0  # one blocking read; the record is looked at between reads
GRACE_READS = 3  # reads with nothing new after the record finished, before its own terminal event is sent


MAX_SEQUENCE_NUMBER = 2**63 - 1  # a stream entry's number (Redis stream ids are unsigned 64-bit; ours stay signed)


def starting_after(query: Any) -> int:
    raw = query.get("starting_after")
    if raw is None:
        return -1
    try:
        value = int(raw) if len(raw) <= 20 else -2
    except ValueError:
        value = -2
    if not -1 <= value < MAX_SEQUENCE_NUMBER:
        raise invalid(
            "starting_after",
            f"starting_after must be an event sequence number (an integer from 0 to {MAX_SEQUENCE_NUMBER - 1}).",
        )
    return value


async def stream_again(request: web.Request, services: Services, record: StoredResponse) -> web.StreamResponse:
    if not record.response.get("background"):
        raise invalid("stream", "Only a response created with background: true can be streamed again.")
    after = starting_after(request.query)
    response = await open_stream(request, {})
    try:
        await pump(request, response, _frames(services, record.tenant, record.id, after))
    except ClientGone:
        return response
    await end_stream(request, response)
    return response


def _terminal(record: StoredResponse, sequence_number: int) -> dict[str, Any]:
    status = record.response["status"]
    if status == "cancelled":
        payload = {
            "type": "error",
            "code": "response_cancelled",
            "message": "The response was cancelled.",
            "param": None,
        }
    else:
        payload = {"type": f"response.{status}", "response": record.response}
    return {**payload, "sequence_number": sequence_number}


async def _frames(services: Services, tenant: str, response_id: str, after: int) -> AsyncIterator[bytes]:
    quiet_reads = 0
    try:
        while True:
            events = await services.events.read(tenant, response_id, after, WAIT_S)
            for event in events:
                yield frame(event, event["type"])
                after = event["sequence_number"]
                if event["type"] in TERMINAL_EVENTS:
                    return
            if events:
                quiet_reads = 0
                continue
            record = await services.store.load(tenant, response_id)
            if record is None:  # deleted meanwhile
                return
            if record.response.get("status") in TERMINAL_STATUSES:
                quiet_reads += 1
                if quiet_reads >= GRACE_READS:
                    yield frame(payload := _terminal(record, after + 1), payload["type"])
                    return
    except StoreUnavailable:
        error = {"type": "error", "code": "service_unavailable", "param": None, "sequence_number": after + 1}
        error["message"] = "The response store is unavailable; stream the response again later."
        yield frame(error, "error")
