"""A hostile client against a real `serve` process (API keys on, a real redis-server): nothing it sends is
fetched, nothing holds the event loop past its 50 ms budget (each test is checked by the gateway's own
`gateway_event_loop_lag_seconds`), and every malformed body is a 4xx naming the parameter, never a 500."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from gateway_fixtures import KEY_SECRET, write_keys
from live_gateway import GatewayProcess
from loop_budget import LoopBudget
from redis_servers import RedisServer

MODEL = "gpt-oss-120b"
AUTH = {"Authorization": "Bearer sk-tenant-a", "Content-Type": "application/json"}
EVIL_ANSWER = '"' + "a" * 40 + '!"'  # ^(a+)+$ against this takes Python's re 2^40 steps
SCRIPT = {
    "rules": [
        {"match": {"user": "evil"}, "emit": [{"final": EVIL_ANSWER}]},
        {"emit": [{"final": '"ok"'}]},
    ]
}


class Listener:
    """A TCP port that counts connections and never answers (an internal host a schema might point at)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.socket.accept()
            except OSError:
                return
            self.connections += 1


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hostile")
    redis = RedisServer(directory / "redis").start()
    script = directory / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_REDIS_URL": redis.url,
        "GATEWAY_MOCK_SCRIPT": str(script),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(directory)),
        "GATEWAY_METRICS_PUBLIC": "1",
    }
    gateway = GatewayProcess(env, directory / "gateway.log").start()
    yield gateway
    gateway.stop()
    redis.stop()
    assert "Traceback" not in gateway.log_text()


LOOP = LoopBudget()


@pytest.fixture(autouse=True)
def within_the_loop_budget(served):
    """Every hostile input of this module is read, checked and refused (or served) without a stall."""
    with LOOP.held(served.url):
        yield


def _post(
    gateway: GatewayProcess,
    body: bytes | dict,
    path: str = "/v1/responses",
    timeout: float = 30,
    headers: dict | None = None,
):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(gateway.url + path, data=data, headers={**AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _schema_format(schema: dict) -> dict:
    return {"format": {"type": "json_schema", "name": "answer", "schema": schema}}


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_schema_references_are_never_fetched(served):
    target = Listener()
    refs = [f"http://127.0.0.1:{target.port}/schema.json", "file:///etc/passwd", "other.json", "#anchor"]
    for ref in refs:
        started = time.monotonic()
        schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
        status, body = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format(schema)})
        assert status == 400 and body["error"]["param"] == "text.format.schema", body
        assert "#/properties/a" in body["error"]["message"]
        assert time.monotonic() - started < 5
        tool = {"type": "function", "name": "f", "parameters": {"$ref": ref}}
        status, body = _post(served, {"model": MODEL, "input": "hi", "tools": [tool]})
        assert status == 400 and body["error"]["param"] == "tools[0].parameters", body
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": ref}}},
        }
        status, body = _post(served, chat, "/v1/chat/completions")
        assert status == 400 and body["error"]["param"] == "response_format.json_schema.schema", body
    assert target.connections == 0


def test_reference_loops_that_never_descend_are_refused_and_recursive_schemas_work(served):
    loops = [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        {"anyOf": [{"$ref": "#"}, {"type": "string"}]},
    ]
    for schema in loops:
        status, body = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format(schema)})
        assert status == 400 and "refers back to itself" in body["error"]["message"], body
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
        },
        "anyOf": [{"$ref": "#/$defs/node"}, {"type": "string"}],
    }
    shared = {"$defs": {"s": {"type": "string"}}, "allOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/s"}]}
    for schema in (tree, shared):
        status, body = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format(schema)})
        assert status == 200 and body["status"] == "completed", body


def test_a_backtracking_pattern_costs_microseconds_and_lookaround_is_refused(served):
    started = time.monotonic()
    schema = {"type": "string", "pattern": "^(a+)+$"}
    status, body = _post(served, {"model": MODEL, "input": "evil", "text": _schema_format(schema)}, timeout=10)
    assert status == 200 and body["status"] == "failed" and body["error"]["code"] == "server_error"
    assert (
        body["error"]["message"].startswith("constraint_not_enforced: ")
        and "does not match" in body["error"]["message"]
    )
    assert time.monotonic() - started < 5  # Python's re would still be backtracking
    props = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}}, "additionalProperties": False}
    status, _ = _post(served, {"model": MODEL, "input": "evil", "text": _schema_format(props)}, timeout=10)
    assert status == 200
    status, body = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format({"pattern": "(?=a)b"})})
    assert status == 400 and "lookaround" in body["error"]["message"]


@pytest.mark.parametrize("levels", [60, 200])
def test_deep_schemas_and_tool_parameters_are_a_400(served, levels):
    status, body = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format(_nested(levels))})
    assert status == 400 and body["error"]["param"].startswith("text.format.schema"), body
    tool = {"type": "function", "name": "f", "parameters": _nested(levels)}
    status, body = _post(served, {"model": MODEL, "input": "hi", "tools": [tool]})
    assert status == 400 and body["error"]["param"].startswith("tools[0].parameters"), body


def test_json_nested_thousands_deep_is_a_400(served):
    for depth in (100, 5000, 200_000):
        body = b'{"model": "gpt-oss-120b", "input": "hi", "metadata": ' + b"[" * depth + b"]" * depth + b"}"
        status, payload = _post(served, body)
        assert status == 400 and payload["error"]["code"] == "nested_too_deep", payload


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"model": "gpt-oss-120b", "input": "\\ud800"}', "input"),
        ('{"model": "gpt-oss-120b", "input": "hi", "instructions": "x\\udfff"}', "instructions"),
        ('{"model": "gpt-oss-120b", "input": "hi", "metadata": {"k": "\\ud83d"}}', "metadata.k"),
        (
            '{"model": "gpt-oss-120b", "input": [{"role": "user", "content": '
            '[{"type": "input_text", "text": "\\udc00"}]}]}',
            "input[0].content[0].text",
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_where_it_is(served, body, param):
    for stream in (False, True):
        sent = json.loads(body)
        sent["stream"] = stream
        status, payload = _post(served, json.dumps(sent).encode())
        assert status == 400 and payload["error"]["param"] == param, payload


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "gpt-oss-120b", "input": "\xed\xa0\x80"}',  # a surrogate's UTF-8 bytes, no escape
        '{"model": "gpt-oss-120b", "input": "\ud800"}'.encode("utf-16-le", "surrogatepass"),  # a UTF-16 body
    ],
)
def test_a_lone_surrogate_sent_as_raw_bytes_is_a_400(served, body):
    """Small bodies skip the tree walk only where nothing can be found: these are still caught."""
    status, payload = _post(served, body)
    assert status == 400 and payload["error"]["param"] == "input", payload


def test_a_small_body_nested_one_level_too_deep_is_a_400(served):
    levels = 65  # the body's object and 65 lists: 66 brackets in under 200 bytes
    body = b'{"model": "gpt-oss-120b", "input": "hi", "metadata": ' + b"[" * levels + b"]" * levels + b"}"
    status, payload = _post(served, body)
    assert status == 400 and payload["error"]["code"] == "nested_too_deep", payload


def test_non_ascii_bytes_in_authorization_are_a_401(served):
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    connection.putrequest("POST", "/v1/responses")
    connection.putheader("Authorization", b"Bearer sk-\xff\xfe\xc3\xa9")
    connection.putheader("Content-Type", "application/json")
    body = json.dumps({"model": MODEL, "input": "hi"}).encode()
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    assert response.status == 401 and json.loads(response.read())["error"]["type"] == "invalid_request_error"


def test_a_huge_prompt_does_not_block_other_clients(served):
    word = "x" * (6 * 1024 * 1024)  # one unbroken 6 MiB word: seconds of BPE

    def send_and_probe() -> tuple[dict, float]:
        result: dict = {}
        sender = threading.Thread(
            target=lambda: result.update(r=_post(served, {"model": MODEL, "input": word}, timeout=120))
        )
        sender.start()
        time.sleep(0.5)  # the body is parsed and being tokenized
        worst = 0.0
        while sender.is_alive():
            started = time.monotonic()
            with urllib.request.urlopen(served.url + "/healthz", timeout=30):
                pass
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
        return result, worst

    result, worst = LOOP.within(served.url, send_and_probe)
    assert result["r"][0] in (200, 400)  # 400: longer than the model's context
    assert worst < 1.0, f"a health check waited {worst:.2f} s behind the tokenizer"


def test_integers_past_64_bits_in_a_schema_are_kept_exactly(served):
    """orjson writes no integer past 64 bits: such a value (a client's schema may hold one) still answers,
    streams and stores, and reads back exactly."""
    huge = 10**30
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"n": {"maximum": huge}}}}
    raw = json.dumps({"model": MODEL, "input": "hi", "tools": [tool], "metadata": {"k": "v"}})
    status, body = _post(served, raw.encode())
    assert status == 200 and body["tools"][0]["parameters"]["properties"]["n"]["maximum"] == huge
    request = urllib.request.Request(served.url + "/v1/responses/" + body["id"], headers=AUTH)
    with urllib.request.urlopen(request, timeout=10) as response:
        stored = json.loads(response.read())
    assert stored["tools"][0]["parameters"]["properties"]["n"]["maximum"] == huge
    stream = json.dumps({"model": MODEL, "input": "hi", "tools": [tool], "stream": True}).encode()
    request = urllib.request.Request(served.url + "/v1/responses", data=stream, headers=AUTH, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert b"event: response.completed" in response.read()


def test_a_compression_bomb_is_refused_after_at_most_the_body_limit_inflated(served):
    bomb = gzip.compress(b'{"model": "' + MODEL.encode() + b'", "input": "' + b" " * (200 * 1024 * 1024) + b'"}')
    status, payload = LOOP.within(served.url, lambda: _post(served, bomb, headers={"Content-Encoding": "gzip"}))
    assert status == 413 and payload["error"]["code"] == "request_too_large"
    status, payload = _post(served, gzip.compress(b"{not json"), headers={"Content-Encoding": "gzip"})
    assert status == 400 and payload["error"]["code"] == "invalid_json"
    status, payload = _post(served, b"{}", headers={"Content-Encoding": "compress"})
    assert status == 415 and payload["error"]["code"] == "unsupported_content_encoding"


def _properties(count: int, description: str = "d" * 40) -> dict:
    fields = {f"field_{n}": {"type": "string", "description": description} for n in range(count)}
    return {"type": "object", "properties": fields}


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (_properties(15_000), "524288"),  # 1.3 MiB of schema: refused by its size alone
        (_properties(6_000, ""), "5000 properties"),  # refused in one walk, before the metaschema
        ({"type": "string", "pattern": "a" * 2000}, "1000 characters"),
        ({"type": "string", "description": "d" * 600_000}, "524288"),
    ],
)
def test_a_schema_past_a_limit_is_refused_before_it_is_compiled_naming_the_limit(served, schema, named):
    started = time.monotonic()
    status, payload = _post(served, {"model": MODEL, "input": "hi", "text": _schema_format(schema)})
    assert status == 400 and payload["error"]["param"] == "text.format.schema"
    assert named in payload["error"]["message"] and time.monotonic() - started < 1  # the issue: within 1 s


def test_large_tool_schemas_are_read_and_checked_off_the_loop(served):
    """5 MiB of tools (1,200 properties each): parsed, checked and rendered without a stall on the first try (a
    checker process started ahead, with what a job needs loaded); answered."""
    tools = [{"type": "function", "name": f"tool_{n}", "parameters": _properties(1_200)} for n in range(60)]
    body = {"model": MODEL, "input": "hi", "tools": tools}
    assert len(json.dumps(body)) > 5 * 1024 * 1024
    with LOOP.held(served.url):
        status, payload = _post(served, body, timeout=120)
    assert status in (200, 400), payload  # 400: the tools overflow the model's context
