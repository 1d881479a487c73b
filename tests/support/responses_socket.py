"""Clients of the Responses WebSocket for tests: the SDK's `connect()` events validated by its own server-event
models, and a raw socket for what the SDK will not send."""

from __future__ import annotations

import json

import openai
import websockets.sync.client as ws_client
from live_gateway import LiveGateway
from pydantic import TypeAdapter

SERVER_EVENT = TypeAdapter(openai.types.responses.ResponsesServerEvent)
TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def api_client(live: LiveGateway, key: str = "sk-tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=30)


def until_done(connection, count: int = 1) -> list:
    """Events until `count` responses have ended, or until the first `error` event."""
    events, ended = [], 0
    for event in connection:
        events.append(SERVER_EVENT.validate_python(event.model_dump(by_alias=True, exclude_unset=True)))
        if event.type in TERMINAL:
            ended += 1
            if ended == count:
                return events
        if event.type == "error":
            return events
    return events


def until_answered(connection) -> list:
    """One create's events: through its terminal event, or its refusal (an `error` event with an HTTP status;
    a failing stream's `error` event has none and its `response.failed` follows)."""
    events = []
    for event in connection:
        events.append(SERVER_EVENT.validate_python(event.model_dump(by_alias=True, exclude_unset=True)))
        if event.type in TERMINAL or (event.type == "error" and event.status is not None):
            return events
    return events


def raw_socket(live: LiveGateway, key: str = "sk-tenant-a", **options):
    url = live.url.replace("http://", "ws://") + "/v1/responses"
    return ws_client.connect(url, additional_headers={"Authorization": f"Bearer {key}"}, **options)


def next_event(socket) -> dict:
    return json.loads(socket.recv(timeout=10))
