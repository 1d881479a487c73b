"""A tool choice that forces a server-side tool, enforced by the engine while it samples: a random model whose
choice is `code_interpreter` writes a python call first (run in the sandbox); one whose choice is an MCP tool
writes that tool's call, its arguments held to the tool's input schema."""

from __future__ import annotations

import openai
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from gateway_fixtures import gateway_settings
from hosted_gateway import sandbox_python
from hosted_servers import McpTestServer
from live_gateway import LiveGateway

MODEL = "gpt-oss-20b"


@pytest.fixture(scope="module")
def mcp():
    server = McpTestServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(tmp_path_factory, mcp):
    directory = tmp_path_factory.mktemp("hosted-choice")
    checkpoint = make_checkpoint(directory / "model", tiny_config(), "original")
    options = {"checkpoint": str(checkpoint), "max_positions": 2048, "cache_dir": str(directory / "graphs")}
    hosted = {
        "python": {"enabled": True, "wall_s": 5, "python": sandbox_python()},
        "mcp": {"allowed_urls": {"default": [mcp.url]}},
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
        "max_calls": 1,
    }
    engine = {"kind": "onnx", "options": options, "models": [MODEL]}
    gateway = LiveGateway(gateway_settings(directory, backends={"engine": engine}, hosted_tools=hosted)).start()
    gateway.wait_until_ready(MODEL)
    yield gateway
    gateway.stop()


def _first_act(response) -> object:
    """The model's first item that is not reasoning (the gateway's own tool listing left out)."""
    return next(item for item in response.output if item.type not in ("reasoning", "mcp_list_tools"))


def test_the_engine_writes_the_python_call_a_tool_choice_forces(live):
    api = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=120)
    response = api.responses.create(
        model=MODEL,
        input="compute",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        tool_choice={"type": "code_interpreter"},
        max_output_tokens=200,
        temperature=0,
    )
    assert _first_act(response).type == "code_interpreter_call"  # a random model's code may run to the token limit


def test_the_engine_writes_the_mcp_call_a_tool_choice_forces_with_valid_arguments(live, mcp):
    api = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=120)
    tool = {"type": "mcp", "server_label": "calc", "server_url": mcp.url, "require_approval": "never"}
    response = api.responses.create(
        model=MODEL,
        input="add",
        tools=[tool],
        tool_choice={"type": "mcp", "server_label": "calc", "name": "add"},
        max_output_tokens=200,
        temperature=0,
    )
    act = _first_act(response)
    assert act.type == "mcp_call" and act.name == "add" and act.server_label == "calc"
    assert act.arguments.startswith('{"a": ')  # held to {a: int, b: int} (a random model's digits may run on)
