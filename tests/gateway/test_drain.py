"""SIGTERM drains a `serve` process: readiness fails, new requests get a clean 503, streams in flight finish
within the budget or end with an error event; no client sees a reset and nothing acknowledged is lost."""

from __future__ import annotations

import http.client
import json
import signal
import threading
from pathlib import Path

from gateway_fixtures import HTTP_AUTH, KEY_SECRET, write_keys, write_script
from live_gateway import GatewayProcess

MODEL = "gpt-oss-120b"
SLOW = {"match": {"user": "slow"}, "token_delay_ms": 40, "emit": [{"analysis": "think " * 25}, {"final": "fin"}]}
LONG = {"match": {"user": "long"}, "token_delay_ms": 50, "emit": [{"analysis": "think " * 200}, {"final": "fin"}]}
SCRIPT = {"rules": [SLOW, LONG, {"emit": [{"final": "hello"}]}]}


def _gateway(tmp_path: Path, drain_s: float, **env: str) -> GatewayProcess:
    settings = {
        "GATEWAY_MOCK_SCRIPT": str(write_script(tmp_path, SCRIPT)),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(tmp_path)),
        "GATEWAY_DRAIN_S": str(drain_s),
        "GATEWAY_KEEPALIVE_S": "0.2",
        **env,
    }
    return GatewayProcess(settings, tmp_path / "gateway.log").start()


def _request(gateway: GatewayProcess, method: str, path: str, body: dict | None = None):
    """One request on a fresh connection: (status, headers, JSON body)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, payload, {**HTTP_AUTH, "Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.headers, json.loads(response.read())
    finally:
        connection.close()


class Stream:
    """A streamed request read line by line in a thread; `started` is set once the first data line arrived."""

    def __init__(self, gateway: GatewayProcess, path: str, body: dict) -> None:
        self.lines: list[str] = []
        self.failure: BaseException | None = None
        self.started = threading.Event()
        self._connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        self._connection.request("POST", path, json.dumps(body).encode(), {**HTTP_AUTH, "Content-Type": "x"})
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            response = self._connection.getresponse()
            assert response.status == 200
            while line := response.readline():
                if line.startswith(b"data: "):
                    self.lines.append(line.decode()[6:].strip())
                    self.started.set()
        except BaseException as exc:  # a reset or a cut chunked body shows up here
            self.failure = exc
        finally:
            self.started.set()
            self._connection.close()

    def events(self, timeout_s: float = 30) -> list:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream did not end"
        assert self.failure is None, f"the stream broke: {self.failure!r}"
        return [line if line == "[DONE]" else json.loads(line) for line in self.lines]


def _stream_responses(gateway: GatewayProcess, text: str) -> Stream:
    stream = Stream(gateway, "/v1/responses", {"model": MODEL, "input": text, "stream": True})
    assert stream.started.wait(10)
    return stream


def _stream_chat(gateway: GatewayProcess, text: str) -> Stream:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True}
    stream = Stream(gateway, "/v1/chat/completions", body)
    assert stream.started.wait(10)
    return stream


def test_sigterm_lets_a_stream_finish_while_refusing_new_work(tmp_path):
    gateway = _gateway(tmp_path, drain_s=20)
    try:
        responses = _stream_responses(gateway, "slow")
        chat = _stream_chat(gateway, "slow")
        gateway.process.send_signal(signal.SIGTERM)
        status, _, ready = _wait_for_draining(gateway)
        assert (status, ready["status"]) == (503, "draining")
        assert _request(gateway, "GET", "/healthz")[0] == 200  # alive: the orchestrator must not kill it early
        status, headers, refused = _request(gateway, "POST", "/v1/responses", {"model": MODEL, "input": "hi"})
        assert status == 503 and refused["error"]["code"] == "server_shutting_down"
        assert refused["error"]["type"] == "server_error" and headers["Retry-After"] == "1"
        assert headers["Connection"] == "close"

        events = responses.events()
        assert [event["type"] for event in events[-1:]] == ["response.completed"]
        assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "fin"
        chat_events = chat.events()
        assert chat_events[-1] == "[DONE]" and chat_events[-2]["choices"][0]["finish_reason"] == "stop"
        assert gateway.process.wait(timeout=10) == 0
        log = gateway.log_text()
        assert '"drain_finished"' in log and '"cut":false' in log
    finally:
        gateway.stop()


def _wait_for_draining(gateway: GatewayProcess):
    for _ in range(100):
        answer = _request(gateway, "GET", "/readyz")
        if answer[0] == 503:
            return answer
        threading.Event().wait(0.02)
    raise AssertionError("readiness never failed after SIGTERM")


def test_sigterm_past_the_budget_ends_streams_with_an_error_and_keeps_the_outcome(tmp_path, redis_server):
    env = {"GATEWAY_REDIS_URL": redis_server.url}
    gateway = _gateway(tmp_path, drain_s=0.5, **env)
    try:
        status, _, queued = _request(
            gateway, "POST", "/v1/responses", {"model": MODEL, "input": "long", "background": True}
        )
        assert status == 200 and queued["status"] == "queued"
        responses = _stream_responses(gateway, "long")
        chat = _stream_chat(gateway, "long")
        gateway.process.send_signal(signal.SIGTERM)

        events = responses.events()
        assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
        assert events[-2]["code"] == "server_shutting_down"
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        streamed_id = events[-1]["response"]["id"]
        chat_events = chat.events()
        assert chat_events[-1]["error"]["code"] == "server_shutting_down"
        assert "[DONE]" not in chat_events  # the SDK raises on the error chunk; it does not take it as the end
        assert gateway.process.wait(timeout=10) == 0
        assert '"cut":true' in gateway.log_text()
    finally:
        gateway.stop()

    restarted = _gateway(tmp_path, drain_s=0.5, **env)  # another replica on the same Redis
    try:
        for response_id in (queued["id"], streamed_id):
            status, _, stored = _request(restarted, "GET", f"/v1/responses/{response_id}")
            assert status == 200 and stored["status"] == "failed"
            assert stored["error"]["code"] == "server_error"  # the SDK's enum for a response's error
            assert stored["error"]["message"].startswith("server_shutting_down: ")
    finally:
        restarted.stop()
