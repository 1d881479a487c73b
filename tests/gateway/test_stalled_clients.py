"""Clients that open streams and never read them: every stream handler ends within the write-stall limit
after its client stops reading, whatever the stream's length, and `gateway_active_streams` returns to 0."""

from __future__ import annotations

import json
import socket
import time

import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway

STALL_S = 1.0
SIZES = range(2_000, 60_000, 1_500)  # words: from what socket buffers hold to far past it


@pytest.fixture
def live(tmp_path):
    rules = [{"match": {"user": f"^size {words}$"}, "emit": [{"final": "w " * words}]} for words in SIZES]
    settings = gateway_settings(tmp_path, {"rules": rules}, write_stall_s=STALL_S, keepalive_s=0.2)
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


def _open_unread(url: str, path: str, body: dict) -> socket.socket:
    """A stream request on a socket whose receive buffer is small and is never read."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-tenant-a\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _active_streams(live: LiveGateway) -> float:
    return live.services.metrics.registry.get_sample_value("gateway_active_streams") or 0.0


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_streams_nobody_reads_end_and_the_gauge_returns_to_zero(live, api):
    sockets = []
    try:
        for words in SIZES:
            if api == "responses":
                body = {"model": "gpt-oss-120b", "input": f"size {words}", "stream": True}
                sockets.append(_open_unread(live.url, "/v1/responses", body))
            else:
                messages = [{"role": "user", "content": f"size {words}"}]
                body = {"model": "gpt-oss-120b", "messages": messages, "stream": True}
                sockets.append(_open_unread(live.url, "/v1/chat/completions", body))
        deadline = time.monotonic() + 20
        while _active_streams(live) < len(SIZES) and time.monotonic() < deadline:
            time.sleep(0.05)
        # the generations are instant: every handler is now writing, or done writing, to a full socket
        deadline = time.monotonic() + 4 * STALL_S + 5
        while _active_streams(live) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _active_streams(live) == 0, f"{_active_streams(live):.0f} stream handlers never ended"
    finally:
        for sock in sockets:
            sock.close()
