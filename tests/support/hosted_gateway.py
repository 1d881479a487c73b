"""A live gateway with every server-side tool on (a real MCP server, a fake SearXNG and web site, the local
Python sandbox) and the mock backend scripting the model's calls: the fixtures and helpers of
tests/gateway/hosted/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
import pytest
from gateway_fixtures import flush, gateway_settings
from hosted_servers import McpTestServer, WebFixtures
from live_gateway import LiveGateway
from pydantic import TypeAdapter

from gateway.config import Settings

MODEL = "gpt-oss-120b"


RESPONSE = TypeAdapter(openai.types.responses.Response)


EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


def sandbox_python() -> str:
    """An interpreter whose standard library the sandbox's own uid can read (as root it runs as another uid)."""
    stdlib = Path(os.__file__).parent
    if os.getuid() != 0 or all(os.stat(p).st_mode & 0o005 == 0o005 for p in [stdlib, *stdlib.parents]):
        return sys.executable
    return "/usr/bin/python3"


PYTHON_CALL = (
    "<|channel|>analysis<|message|>Let me compute.<|end|>"
    "<|start|>assistant<|channel|>analysis to=python code<|message|>{code}<|call|>"
)


def python_rule(match: str, code: str) -> dict:
    return {"match": {"user": match}, "emit": [{"raw": PYTHON_CALL.format(code=code)}]}


SCRIPT = {
    "rules": [
        # after a tool answered: the answer quotes it (or, for "keep calling", the model calls again)
        {"match": {"tool": "^1\n$|^Not run"}, "emit": [{"raw": PYTHON_CALL.format(code="1")}]},
        {"match": {"tool": "(?s)^42\\n$"}, "emit": [{"final": "The answer is 42."}]},
        {"match": {"tool": "timed out|sandbox process ended|MemoryError|not run"}, "emit": [{"final": "It failed."}]},
        {
            "match": {"tool": "Search results"},
            "emit": [{"raw": '<|channel|>analysis to=browser.open code<|message|>{"id": 0, "cursor": 0}<|call|>'}],
        },
        {"match": {"tool": "Tides explained"}, "emit": [{"final": "The Moon causes tides【1†L2】."}]},
        {"match": {"tool": "^5$"}, "emit": [{"final": "2 + 3 = 5"}]},
        {"match": {"tool": "authorized|anonymous"}, "emit": [{"final": "whoami said so"}]},
        {"match": {"tool": "declined"}, "emit": [{"final": "Understood, not adding."}]},
        {"match": {"tool": "Error"}, "emit": [{"final": "The tool failed."}]},
        {"match": {"tool": "."}, "emit": [{"final": "Done."}]},
        # the user's requests: each scripts a call
        python_rule("compute", "x = 41\nx + 1"),
        python_rule("again", "x + 1"),
        python_rule("loop forever", "while True:\n    pass"),
        python_rule("memory bomb", "b = bytearray(8 * 1024 ** 3)"),
        python_rule(
            "fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        ),
        python_rule("keep calling", "1"),
        {
            "match": {"user": "search"},
            "emit": [
                {"raw": '<|channel|>analysis to=browser.search code<|message|>{"query": "what causes tides"}<|call|>'}
            ],
        },
        {
            "match": {"user": "metadata"},
            "emit": [
                {
                    "raw": '<|channel|>analysis to=browser.open code<|message|>{"id": "http://169.254.169.254/latest"}<|call|>'
                }
            ],
        },
        {
            "match": {"user": "localhost"},
            "emit": [
                {"raw": '<|channel|>analysis to=browser.open code<|message|>{"id": "http://localhost:9/admin"}<|call|>'}
            ],
        },
        {
            "match": {"user": "add"},
            "emit": [{"tool_call": {"namespace": "calc", "name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"match": {"user": "who"}, "emit": [{"tool_call": {"namespace": "calc", "name": "whoami", "arguments": {}}}]},
        {"match": {"user": "broken"}, "emit": [{"tool_call": {"namespace": "calc", "name": "fail", "arguments": {}}}]},
        {"emit": [{"final": "Hello."}]},
    ]
}


@pytest.fixture(scope="module")
def mcp_server():
    server = McpTestServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def web():
    fixtures = WebFixtures().start()
    yield fixtures
    fixtures.stop()


def hosted_settings(tmp_path: Path, web: WebFixtures, mcp_url: str, **python: object) -> Settings:
    hosted = {
        "python": {"enabled": True, "wall_s": 2, "python": sandbox_python(), "memory_mb": 256, **python},
        "web_search": {"provider": "searxng", "url": web.url},
        "mcp": {"allowed_urls": {"default": [mcp_url]}},
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
    }
    return gateway_settings(tmp_path, SCRIPT, keepalive_s=0.2, hosted_tools=hosted)


@pytest.fixture(params=["memory", "redis"])
def gateway(request, tmp_path, web, mcp_server):
    settings = hosted_settings(tmp_path, web, mcp_server.url)
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        flush(server)
        settings = settings.model_copy(update={"redis_url": server.url})
    live = LiveGateway(settings).start()
    yield live
    live.stop()


@pytest.fixture
def memory_gateway(tmp_path, web, mcp_server):
    live = LiveGateway(hosted_settings(tmp_path, web, mcp_server.url)).start()
    yield live
    live.stop()


def client(gateway: LiveGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=60)


def create(api: openai.OpenAI, stream: bool, **body):
    """The final response (validated against the SDK's models) and, streamed, its events (validated too)."""
    if not stream:
        response = api.responses.create(model=MODEL, **body)
        return RESPONSE.validate_python(response.model_dump(by_alias=True, exclude_unset=True)), []
    events = [
        EVENT.validate_python(event.model_dump(by_alias=True, exclude_unset=True))
        for event in api.responses.create(model=MODEL, stream=True, **body)
    ]
    assert events[-1].type == "response.completed", [e.type for e in events]
    sequence = [event.sequence_number for event in events]
    assert sequence == list(range(len(events)))
    return RESPONSE.validate_python(events[-1].response.model_dump(by_alias=True, exclude_unset=True)), events


PYTHON_TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}


def of(response, kind: str) -> list:
    return [item for item in response.output if item.type == kind]


SEARCH_TOOL = {"type": "web_search"}


def mcp_tool(server: McpTestServer, **extra) -> dict:
    return {"type": "mcp", "server_label": "calc", "server_url": server.url, **extra}
