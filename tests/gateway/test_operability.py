"""An operator's view of `serve`: one-line errors naming what is wrong, what the store looks like at start,
request ids on every answer, and connections that cannot be held open by clients that send or read nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from live_gateway import GatewayProcess
from redis_servers import RedisServer, free_port
from sse_load import active_streams

from harmony import vocab

MODEL = "gpt-oss-120b"
HUGE_ANSWER = " ".join(f"w{i}" for i in range(60_000))
SCRIPT = {"rules": [{"match": {"user": "huge"}, "emit": [{"final": HUGE_ANSWER}]}, {"emit": [{"final": "ok"}]}]}


def _serve_fails(env: dict[str, str], args: tuple[str, ...] = ("serve",)) -> str:
    """Run the CLI expecting exit status 2 within seconds; its stderr."""
    full = {**os.environ, vocab.DOWNLOAD_ENV: "0", **env}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], env=full, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_busy_port_is_one_line_even_with_the_engine_backend():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for backend in ("mock", "onnx"):
            err = _serve_fails({"GATEWAY_PORT": str(port), "GATEWAY_BACKEND": backend})
            assert err.strip().count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"GATEWAY_PORT": "abc"}, "GATEWAY_PORT"),
        ({"GATEWAY_BACKEND_OPTIONS": "{bad json"}, "GATEWAY_BACKEND_OPTIONS is not valid JSON"),
        (
            {"GATEWAY_LIMITS": '{"default": {"requests_per_minute": -1}}'},
            "GATEWAY_LIMITS (default.requests_per_minute)",
        ),
        ({"GATEWAY_REDIS_URL": "redis://127.0.0.1:notaport/0"}, "GATEWAY_REDIS_URL"),
        ({"GATEWAY_REDIS_URL": "memcached://127.0.0.1"}, "GATEWAY_REDIS_URL"),
        ({"GATEWAY_VOCAB_PATH": "/nonexistent/o200k_base.tiktoken"}, "GATEWAY_VOCAB_PATH"),
        ({"GATEWAY_EVENT_LOOP": "trio"}, "GATEWAY_EVENT_LOOP"),
    ],
)
def test_config_errors_name_the_variable(env, names):
    err = _serve_fails({"GATEWAY_PORT": str(free_port()), **env})
    assert names in err


def test_keys_create_refuses_a_secret_serve_would_refuse(tmp_path):
    env = {"GATEWAY_KEY_SECRET": "short"}
    err = _serve_fails(env, ("keys", "create", "--tenant", "t", "--file", str(tmp_path / "keys.json")))
    assert "16+ characters" in err and not (tmp_path / "keys.json").exists()


def test_the_store_is_checked_and_reported_at_start(tmp_path):
    locked = RedisServer(tmp_path / "locked", extra=("--requirepass", "right-password")).start()
    evicting = RedisServer(tmp_path / "lru", extra=("--maxmemory-policy", "allkeys-lru")).start()
    try:
        wrong = f"redis://:wrong@127.0.0.1:{locked.port}/0"
        gateway = GatewayProcess({"GATEWAY_REDIS_URL": wrong}, tmp_path / "locked.log").start(ready=False)
        try:
            with pytest.raises(urllib.error.HTTPError) as unready:
                urllib.request.urlopen(gateway.url + "/readyz", timeout=5)
            assert "authentication failed" in json.load(unready.value)["store"]
            assert "store_unavailable_at_start" in gateway.log_text()
            assert "authentication failed" in gateway.log_text() and "right-password" not in gateway.log_text()
        finally:
            gateway.stop()
        gateway = GatewayProcess({"GATEWAY_REDIS_URL": evicting.url}, tmp_path / "lru.log").start()
        gateway.stop()
        log = gateway.log_text()
        assert '"store_ready"' in log and '"store_evicts"' in log and "allkeys-lru" in log
    finally:
        locked.stop()
        evicting.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("operability")
    script = directory / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_MOCK_SCRIPT": str(script),
        "GATEWAY_HEADER_TIMEOUT_S": "1.5",
        "GATEWAY_WRITE_STALL_S": "1.5",
        "GATEWAY_METRICS_PUBLIC": "true",
    }
    gateway = GatewayProcess(env, directory / "gateway.log").start()
    yield gateway
    gateway.stop()
    assert "Traceback" not in gateway.log_text()


def _call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_every_answer_carries_a_request_id_and_the_log_has_it(served):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    calls = [
        ("/v1/models", "GET", None, 200),
        ("/v1/responses/resp_missing", "GET", None, 404),
        ("/v1/responses", "POST", {"model": 5}, 400),
        ("/v1/chat/completions", "POST", chat, 200),
        ("/v1/nowhere", "GET", None, 404),
    ]
    for path, method, body, expected in calls:
        status, headers = _call(served.url + path, method, body)
        assert status == expected and headers.get("X-Request-ID"), (path, status, headers)
    lines = served.json_lines_until(lambda lines: sum(line.get("event") == "request" for line in lines) >= len(calls))
    access = [line for line in lines if line.get("event") == "request"]
    assert len(access) >= len(calls) and all(line["request_id"] for line in access)


def test_ready_is_announced_after_listening(served):
    log = served.log_text()
    assert log.index("listening on") < log.index("ready on")


def test_it_serves_on_uvloop_unless_told_asyncio(served, tmp_path):
    assert "(event loop: uvloop)" in served.log_text()  # the running loop's own module, as announced
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    plain = GatewayProcess({"GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_EVENT_LOOP": "asyncio"}, tmp_path / "g.log")
    plain.start()
    try:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert _call(plain.url + "/v1/chat/completions", "POST", chat)[0] == 200
    finally:
        plain.stop()
    assert "(event loop: asyncio)" in plain.log_text() and "Traceback" not in plain.log_text()


def test_a_client_that_trickles_its_headers_is_disconnected(served):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(10):
            time.sleep(0.5)
            try:
                conn.sendall(b"X")
                if conn.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.monotonic() - started < 4.5
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as idle:  # sends nothing at all
        idle.settimeout(5)
        assert idle.recv(1) == b""


def test_a_kept_alive_connection_survives_idle_time_between_requests(served):
    connection = __import__("http.client").client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    for _ in range(2):
        connection.request("GET", "/healthz")
        assert connection.getresponse().read()
        time.sleep(2.0)  # longer than the header deadline, shorter than the idle timeout
    connection.close()


def test_a_stream_nobody_reads_is_cut_and_frees_its_memory(served):
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(("127.0.0.1", served.port))
    body = json.dumps({"model": MODEL, "input": "huge", "stream": True}).encode()
    head = f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    conn.sendall(head.encode() + b"\r\n\r\n" + body)
    try:
        deadline = time.monotonic() + 20
        while active_streams(served.url) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        while active_streams(served.url) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)  # the client reads nothing: its stream must be cut, not buffered
        assert active_streams(served.url) == 0
    finally:
        conn.close()


def test_a_body_that_never_finishes_arriving_is_a_408(tmp_path):
    gateway = GatewayProcess({"GATEWAY_BODY_TIMEOUT_S": "1"}, tmp_path / "gateway.log").start()
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as conn:
            conn.sendall(
                b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"model": '
            )
            started = time.monotonic()
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert time.monotonic() - started < 5
    finally:
        gateway.stop()
