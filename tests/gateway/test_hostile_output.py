"""Model output is untrusted input: hypothesis-generated hostile token streams, fed by a backend through a
live gateway, never fail a request. Every API answers 200 with a well-formed object or a complete SSE
stream (ordered sequence numbers, one terminal event), whatever the model emits."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_gateway import LiveGateway
from strategies import special_heavy_tokens

from backends.base import Capabilities, Chunk
from gateway.config import Settings
from harmony import load_harmony_encoding
from harmony.tokens import CALL, RETURN

MODEL = "gpt-oss-120b"
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
# what the model says cannot fail the response: failure is for backends and broken constraints only
ANSWERED = ("completed", "incomplete")
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
CHAT_FUNCTION = {"name": "get_weather", "parameters": {"type": "object"}}


class ReplayBackend:
    """Emits whatever tokens the test sets, a few per chunk, as a broken or adversarial model might."""

    capabilities = Capabilities(context_length=8192)

    def __init__(self) -> None:
        self.tokens: list[int] = []

    async def generate(self, request):
        for start in range(0, len(self.tokens), 3):
            yield Chunk(self.tokens[start : start + 3])

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def live():
    backend = ReplayBackend()
    gateway = LiveGateway(Settings(backend="mock"), backend).start()
    yield gateway, backend
    gateway.stop()


def _post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()  # a reset or a cut chunked body raises here
    finally:
        connection.close()


def _events(raw: bytes) -> list[tuple[str | None, str]]:
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if lines:
            name = next((line[7:] for line in lines if line.startswith("event: ")), None)
            data = next(line[6:] for line in lines if line.startswith("data: "))
            events.append((name, data))
    return events


# pieces of Harmony put together in any order: headers that almost parse, empty and odd recipients,
# constrain markers, calls without recipients, text where a header should be
FRAGMENTS = [
    "<|start|>",
    "assistant",
    "<|channel|>",
    "analysis",
    "final",
    "commentary",
    " to=functions.get_weather",
    " to=functions.",
    " to=",
    " to=browser.search",
    " <|constrain|>json",
    "<|constrain|>",
    "<|message|>",
    '{"city": "Paris"}',
    "{not json",
    "plain words ",
    "\u00e9t\u00e9 ",
    "<|end|>",
    "<|call|>",
    "<|return|>",
]
ENCODING = load_harmony_encoding()
harmony_pieces = st.lists(st.sampled_from(FRAGMENTS), max_size=24).map(
    lambda pieces: [token for piece in pieces for token in ENCODING.encode_marked(piece)]
)
hostile = st.one_of(special_heavy_tokens, harmony_pieces, special_heavy_tokens.map(lambda tokens: [*tokens, RETURN]))
ending = st.sampled_from([[], [RETURN], [CALL]])


@settings(max_examples=150, deadline=None)
@given(hostile, ending, st.booleans())
def test_hostile_model_output_never_fails_a_request(live, tokens, end, with_tools):
    gateway, backend = live
    backend.tokens = tokens + end
    tools = {"tools": TOOLS} if with_tools else {}

    status, raw = _post(gateway.port, "/v1/responses", {"model": MODEL, "input": "hi", **tools})
    assert status == 200, raw[:300]
    response = json.loads(raw)
    assert response["status"] in ANSWERED, response.get("error")
    assert all(item["type"] in ("reasoning", "message", "function_call") and item["id"] for item in response["output"])

    status, raw = _post(gateway.port, "/v1/responses", {"model": MODEL, "input": "hi", "stream": True, **tools})
    assert status == 200
    events = _events(raw)
    numbers = [json.loads(data)["sequence_number"] for _, data in events]
    assert numbers == list(range(len(numbers)))
    assert [name for name, _ in events if name in TERMINAL] == [events[-1][0]]
    assert events[-1][0].removeprefix("response.") in ANSWERED

    chat_tools = {"tools": [{"type": "function", "function": CHAT_FUNCTION}]} if with_tools else {}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **chat_tools}
    status, raw = _post(gateway.port, "/v1/chat/completions", body)
    assert status == 200, raw[:300]
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] in ("stop", "length", "tool_calls") and choice["message"]["role"] == "assistant"

    status, raw = _post(gateway.port, "/v1/chat/completions", body | {"stream": True})
    assert status == 200
    chunks = _events(raw)
    assert chunks[-1][1] == "[DONE]"
    assert all("choices" in json.loads(data) or "error" in json.loads(data) for _, data in chunks[:-1])


def test_a_tool_call_without_to_reaches_the_client_as_a_function_call(live):
    gateway, backend = live
    backend.tokens = ENCODING.encode_marked(
        '<|channel|>commentary functions.get_weather<|message|>{"city":"Paris"}<|call|>'
    )
    status, raw = _post(gateway.port, "/v1/responses", {"model": MODEL, "input": "hi", "tools": TOOLS})
    assert status == 200
    (call,) = json.loads(raw)["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["arguments"] == '{"city":"Paris"}'
