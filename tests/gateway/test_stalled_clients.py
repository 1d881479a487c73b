"""Clients that open streams and never read them: every stream handler ends, whatever the stream's length, and
`gateway_active_streams` returns to 0; a stream far longer than socket buffers hold is cut once its client stops
reading (its usage record is cancelled, short of its answer), not run to its end."""

from __future__ import annotations

import json
import socket
import time

import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway

from state.usage_ledger import UsageRecord

STALL_S = 1.0
SIZES = range(2_000, 60_000, 4_000)  # words (a token each): from what socket buffers hold to far past it
HANG_S = 60  # a hung handler never ends: this bounds only how long the test takes to say so


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


def _records(live: LiveGateway) -> list[UsageRecord]:
    return live.call(live.services.ledger.page("tenant-a", 0, None, 1000)).records


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
        # the generations are instant: each handler writes until its client's socket buffers are full, then waits;
        # how long filling them takes depends on the machine, so the deadline is one only a hang overruns
        deadline = time.monotonic() + HANG_S
        while (len(_records(live)) < len(SIZES) or _active_streams(live) > 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _active_streams(live) == 0, f"{_active_streams(live):.0f} stream handlers never ended"
        records = _records(live)
        assert len(records) == len(SIZES)  # one each, billed for what ran
        # the longest stream's answer was not run to its end: no record has all of its tokens
        assert max(record.output_tokens for record in records) < max(SIZES)
    finally:
        for sock in sockets:
            sock.close()
