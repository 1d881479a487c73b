"""The Responses API at the HTTP level: bad input → OpenAI-shaped 4xx naming the parameter, SSE keep-alive,
client disconnects, the OpenAPI document."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

import pytest
from gateway_fixtures import HTTP_AUTH, gateway_settings
from live_gateway import FailingBackend, LiveGateway
from loop_probe import slowest_healthz_during
from redis_servers import RedisServer

from gateway.config import Settings
from gateway.openapi import openapi_document

MODEL = "gpt-oss-120b"


def _request(url: str, body: bytes | None = None, method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json", **HTTP_AUTH}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _open_stream(url: str, body: dict):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **HTTP_AUTH}
    )
    response = urllib.request.urlopen(request, timeout=30)
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return response


BAD_REQUESTS = [
    # (body, status, param, code)
    ('{"model": "gpt-oss-120b", "input": ', 400, None, "invalid_json"),
    ("[1, 2]", 400, None, "invalid_type"),
    ("\xff\xfe", 400, None, "invalid_json"),
    ({"input": "hi"}, 400, "model", "missing_required_parameter"),
    ({"model": MODEL, "input": 5}, 400, "input", "invalid_value"),
    ({"model": MODEL, "input": "hi", "temperature": "hot"}, 400, "temperature", "invalid_value"),
    ({"model": MODEL, "input": "hi", "temperature": 3}, 400, "temperature", "invalid_value"),
    ({"model": MODEL, "input": "hi", "max_output_tokens": 1}, 400, "max_output_tokens", "invalid_value"),
    ({"model": MODEL, "input": "hi", "stream": "yes"}, 400, "stream", "invalid_value"),
    ({"model": MODEL, "input": "hi", "frobnicate": True}, 400, "frobnicate", "unknown_parameter"),
    (
        {"model": MODEL, "input": [{"role": "user", "content": "x", "extra": 1}]},
        400,
        "input[0].extra",
        "unknown_parameter",
    ),
    ({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role", "invalid_value"),
    ({"model": MODEL, "input": [{"type": "input_image"}]}, 400, "input[0].type", "invalid_value"),
    (
        {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0].type",
        "invalid_value",
    ),
    ({"model": MODEL, "input": [{"type": "function_call", "call_id": "c"}]}, 400, "input[0].name", None),
    (
        {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        400,
        "input[0].call_id",
        "invalid_value",
    ),
    ({"model": MODEL, "input": "hi", "tool_choice": "sometimes"}, 400, "tool_choice", "invalid_value"),
    ({"model": MODEL, "input": "hi", "tool_choice": {"type": "function", "name": "f"}}, 400, "tool_choice", None),
    ({"model": MODEL, "input": "hi", "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "file_search"}]}, 400, "tools[0].type", "invalid_value"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "a b"}]}, 400, "tools[0].name", None),
    (
        {
            "model": MODEL,
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 7}}},
        },
        400,
        "text.format.schema",
        "invalid_value",
    ),
    ({"model": MODEL, "input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format", "invalid_value"),
    ({"model": MODEL, "input": "hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort", "invalid_value"),
    ({"model": MODEL, "input": "hi", "include": ["everything"]}, 400, "include", "invalid_value"),
    ({"model": MODEL, "input": "hi", "include": ["message.output_text.logprobs"]}, 400, "include", None),
    ({"model": MODEL, "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata", "invalid_value"),
    ({"model": MODEL, "input": "hi", "background": True, "store": False}, 400, "background", None),
    ({"model": MODEL, "input": "hi", "truncation": "sometimes"}, 400, "truncation", "invalid_value"),
    ({"model": "gpt-5", "input": "hi"}, 404, "model", "model_not_found"),
    (
        {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
        400,
        "previous_response_id",
        "previous_response_not_found",
    ),
    (
        {"model": MODEL, "input": [{"type": "reasoning", "summary": [], "encrypted_content": "gwr1.k2.AAAA"}]},
        400,
        "input[0].encrypted_content",
        "invalid_encrypted_content",
    ),
]


@pytest.mark.parametrize("body,status,param,code", BAD_REQUESTS)
def test_bad_requests_get_openai_errors_naming_the_parameter(gateway, body, status, param, code):
    content = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else json.dumps(body).encode()
    got, payload = _request(gateway.url + "/v1/responses", content)
    assert got == status, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def _post_raw(port: int, body: bytes) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(
            "POST", "/v1/responses", body=body, headers={"Content-Type": "application/json", **HTTP_AUTH}
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_oversize_body_is_413(tmp_path):
    live = LiveGateway(Settings(max_body_bytes=10_000)).start()
    try:
        body = json.dumps({"model": MODEL, "input": "x" * 20_000}).encode()
        status, payload = _post_raw(live.port, body)
        assert status == 413 and payload["error"]["code"] == "request_too_large"
        assert _post_raw(live.port, json.dumps({"model": MODEL, "input": "x" * 9_000}).encode())[0] == 200
    finally:
        live.stop()


def test_unknown_route_and_method_are_openai_shaped(gateway):
    status, payload = _request(gateway.url + "/v1/nothing", method="GET")
    assert status == 404 and payload["error"]["code"] == "not_found"
    status, payload = _request(gateway.url + "/v1/responses", method="PUT")
    assert status == 405 and payload["error"]["code"] == "method_not_allowed"


def _sse(gateway, body: dict) -> list[str]:
    with _open_stream(gateway.url + "/v1/responses", body) as response:
        return [line.decode().rstrip("\n") for line in response]


def test_keepalive_comments_while_the_model_is_silent(gateway):
    """The fixture's keep-alive interval is 0.2 s; the pause rule waits 300 ms before each token."""
    lines = _sse(gateway, {"model": MODEL, "input": "pause", "stream": True})
    assert lines.count(": keep-alive") >= 3
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert data[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/responses", {"model": MODEL, "input": "answer slowly", "stream": True}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "slowly"}], "stream": True}),
    ],
    ids=["responses", "chat"],
)
def test_client_disconnect_stops_the_generation(gateway, path, body):
    with _open_stream(gateway.url + path, body) as response:
        for line in response:
            if b"reasoning" in line and b"delta" in line:  # a token arrived: the generation runs
                break
        assert gateway.backend.active == 1
    deadline = time.monotonic() + 5
    while gateway.backend.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.backend.active == 0, "the generation kept running after the client left"


def test_openapi_document_describes_the_routes(gateway):
    status, document = _request(gateway.url + "/openapi.json", method="GET")
    assert status == 200
    assert document == json.loads(json.dumps(openapi_document()))
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    assert set(paths) == {
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        "/v1/responses/{response_id}/input_items",
        "/v1/responses/input_tokens",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/conversations",
        "/v1/conversations/{conversation_id}",
        "/v1/conversations/{conversation_id}/items",
        "/v1/conversations/{conversation_id}/items/{item_id}",
        "/v1/usage/records",
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
    }
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    schemas = document["components"]["schemas"]
    assert {"ResponsesRequest", "ResponseObject", "FunctionCallInput", "ReasoningOut", "ChatRequest", "Error"} <= set(
        schemas
    )
    for ref in _refs(document):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_a_backend_failure_fails_the_response_not_the_request(encoding):
    live = LiveGateway(Settings(), backend=FailingBackend(encoding)).start()
    try:
        status, payload = _request(live.url + "/v1/responses", json.dumps({"model": MODEL, "input": "hi"}).encode())
        assert status == 200 and payload["status"] == "failed"
        assert payload["error"]["code"] == "server_error" and payload["output"][0]["status"] == "incomplete"
        lines = _sse(live, {"model": MODEL, "input": "hi", "stream": True})
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert [event["type"] for event in data[-2:]] == ["error", "response.failed"]
        assert [event["sequence_number"] for event in data] == list(range(len(data)))
    finally:
        live.stop()


def test_a_redis_outage_is_a_503_or_an_honest_store_false_and_recovers(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    live = LiveGateway(Settings(redis_url=server.url)).start()
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()
    try:
        status, kept = _request(live.url + "/v1/responses", body)
        assert status == 200 and kept["store"] is True
        server.stop()
        status, ready = _request(live.url + "/readyz", method="GET")
        assert status == 503 and ready["store"] == "Redis is unreachable"
        status, payload = _request(live.url + f"/v1/responses/{kept['id']}", method="GET")
        assert status == 503 and payload["error"]["type"] == "server_error"
        status, answered = _request(live.url + "/v1/responses", body)
        assert status == 200 and answered["status"] == "completed" and answered["store"] is False
        server.start()
        status, payload = _request(live.url + f"/v1/responses/{kept['id']}", method="GET")
        assert status == 404  # nothing persisted on disk: the restarted Redis is empty, and says so
        status, again = _request(live.url + "/v1/responses", body)
        assert status == 200 and again["store"] is True
        assert _request(live.url + f"/v1/responses/{again['id']}", method="GET")[0] == 200
    finally:
        live.stop()
        server.stop()


def test_request_ids_are_echoed_when_well_formed(gateway):
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()
    for given, echoed in (("trace-1.a_B", True), ("bad id with spaces", False)):
        request = urllib.request.Request(
            gateway.url + "/v1/responses",
            data=body,
            headers={"Content-Type": "application/json", "X-Request-ID": given, **HTTP_AUTH},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            header = response.headers["X-Request-ID"]
        assert (header == given) is echoed and header


def test_a_background_stream_runs_on_after_the_client_leaves(gateway):
    body = {"model": MODEL, "input": "answer slowly", "stream": True, "background": True}
    with _open_stream(gateway.url + "/v1/responses", body) as response:
        for line in response:
            if line.startswith(b"data: ") and b"response.created" in line:
                response_id = json.loads(line[6:])["response"]["id"]
            if b"reasoning_text.delta" in line:
                break
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        status, payload = _request(f"{gateway.url}/v1/responses/{response_id}", method="GET")
        if payload.get("status") == "completed":
            break
        time.sleep(0.1)
    assert (
        status == 200
        and payload["status"] == "completed"
        and payload["output"][-1]["content"][0]["text"] == "done slowly"
    )


def test_a_large_schema_is_checked_off_the_event_loop_in_both_apis(tmp_path):
    """A 1 MB `text.format` / `response_format` schema takes seconds to check: other clients never wait on it."""
    props = {f"field_{i}": {"type": "string", "description": "x" * 40} for i in range(12_000)}
    schema = {"type": "object", "properties": props, "required": ["field_0"], "additionalProperties": False}
    text = {"format": {"type": "json_schema", "name": "big", "schema": schema}}
    chat_format = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    bodies = {
        "/v1/responses": {"model": "gpt-oss-120b", "input": "hi", "text": text},
        "/v1/chat/completions": {
            "model": "gpt-oss-120b",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": chat_format,
        },
    }
    live = LiveGateway(gateway_settings(tmp_path)).start()
    try:
        for path, body in bodies.items():
            (status, answer), slowest = slowest_healthz_during(
                live.url, lambda path=path, body=body: _request(live.url + path, json.dumps(body).encode())
            )
            assert status in (200, 400), answer  # the mock's context cannot hold it; the check still ran
            assert slowest < 0.5, (path, slowest)
    finally:
        live.stop()
