"""What the gateway's server-side tools fetch is untrusted input too: a hostile MCP server's oversized tool list
or tool result, and oversized or pathological web pages, against a real `serve` process. Each is bounded, answered
(never a 500) and read without holding the event loop past its 50 ms budget (the gateway's own
`gateway_event_loop_lag_seconds`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from gateway_fixtures import KEY_SECRET, write_keys
from hosted_servers import HostileMcpServer, WebFixtures
from live_gateway import GatewayProcess
from loop_budget import LoopBudget

MODEL = "gpt-oss-120b"
REPLY_BYTES = 30 * 1024 * 1024
MAX_OUTPUT_CHARS = 100_000
LOOP = LoopBudget()
DUMP_CALL = {"namespace": "dump", "name": "dump", "arguments": {}}
PAGES = ("big", "unclosed", "deep")


def _open(url: str) -> dict:
    return {"raw": f'<|channel|>analysis to=browser.open code<|message|>{{"id": "{url}"}}<|call|>'}


def _script(web: WebFixtures) -> dict:
    return {
        "rules": [
            {"match": {"tool": "."}, "emit": [{"final": "Done."}]},
            {"match": {"user": "dump"}, "emit": [{"tool_call": DUMP_CALL}]},
            *[{"match": {"user": f"page {name}"}, "emit": [_open(f"{web.url}/pages/{name}")]} for name in PAGES],
            {"emit": [{"final": "Hello."}]},
        ]
    }


@pytest.fixture(scope="module")
def upstreams():
    hostile, web = HostileMcpServer(REPLY_BYTES).start(), WebFixtures().start()
    yield hostile, web
    hostile.stop()
    web.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory, upstreams):
    hostile, web = upstreams
    directory = tmp_path_factory.mktemp("upstreams")
    (directory / "script.json").write_text(json.dumps(_script(web)))
    hosted = {
        "web_search": {"provider": "searxng", "url": web.url},
        "mcp": {
            "allowed_urls": {"default": [hostile.url(kind) for kind in ("", "huge-list", "huge-call")]},
            "max_output_chars": MAX_OUTPUT_CHARS,
        },
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
    }
    env = {
        "GATEWAY_MOCK_SCRIPT": str(directory / "script.json"),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(directory)),
        "GATEWAY_METRICS_PUBLIC": "1",
        "GATEWAY_HOSTED_TOOLS": json.dumps(hosted),
    }
    gateway = GatewayProcess(env, directory / "gateway.log").start()
    yield gateway
    gateway.stop()
    assert "Traceback" not in gateway.log_text()


@pytest.fixture(autouse=True)
def within_the_loop_budget(served):
    with LOOP.held(served.url):
        yield


def _create(gateway: GatewayProcess, body: dict) -> tuple[int, dict]:
    headers = {"Authorization": "Bearer sk-tenant-a", "Content-Type": "application/json"}
    request = urllib.request.Request(gateway.url + "/v1/responses", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _mcp(url: str) -> dict:
    return {"type": "mcp", "server_label": "dump", "server_url": url, "require_approval": "never"}


def test_a_well_behaved_mcp_server_of_the_same_kind_is_called(served, upstreams):
    hostile, _ = upstreams
    status, response = _create(served, {"model": MODEL, "input": "dump", "tools": [_mcp(hostile.url())]})
    assert status == 200, response
    call = next(item for item in response["output"] if item["type"] == "mcp_call")
    assert call["output"] == "short" and call["error"] is None


def test_an_oversized_mcp_tool_list_is_refused_unread(served, upstreams):
    hostile, _ = upstreams
    body = {"model": MODEL, "input": "dump", "tools": [_mcp(hostile.url("huge-list"))]}
    status, response = LOOP.within(served.url, lambda: _create(served, body))
    assert status == 424 and "Error retrieving tool list" in response["error"]["message"], response


def test_an_oversized_mcp_tool_result_is_an_mcp_error_unread(served, upstreams):
    hostile, _ = upstreams
    body = {"model": MODEL, "input": "dump", "tools": [_mcp(hostile.url("huge-call"))]}
    status, response = LOOP.within(served.url, lambda: _create(served, body))
    assert status == 200, response
    call = next(item for item in response["output"] if item["type"] == "mcp_call")
    assert call["output"] is None and call["error"] is not None
    assert len(json.dumps(response)) < 2 * MAX_OUTPUT_CHARS


@pytest.mark.parametrize("page", PAGES)
def test_a_fetched_page_is_read_within_the_loop_budget(served, page):
    body = {"model": MODEL, "input": f"page {page}", "tools": [{"type": "web_search"}]}
    status, response = LOOP.within(served.url, lambda: _create(served, body))
    assert status == 200, response
    assert response["output"][-1]["type"] == "message"
