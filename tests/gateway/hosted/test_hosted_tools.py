"""Server-side tools through the real `openai` SDK against a live gateway: the mock backend scripts the
model's calls; the gateway runs them on a real MCP server (the `mcp` SDK's), a fake SearXNG speaking its
JSON API with a small web site, and the local Python sandbox, all inside one response."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from gateway_fixtures import flush, gateway_settings
from hosted_servers import McpTestServer, WebFixtures
from live_gateway import LiveGateway
from pydantic import TypeAdapter

from gateway.config import Settings, load_settings

MODEL = "gpt-oss-120b"
RESPONSE = TypeAdapter(openai.types.responses.Response)
EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


def _sandbox_python() -> str:
    """An interpreter whose standard library the sandbox's own uid can read (as root it runs as another uid)."""
    stdlib = Path(os.__file__).parent
    if os.getuid() != 0 or all(os.stat(p).st_mode & 0o005 == 0o005 for p in [stdlib, *stdlib.parents]):
        return sys.executable
    return "/usr/bin/python3"


PYTHON_CALL = (
    "<|channel|>analysis<|message|>Let me compute.<|end|>"
    "<|start|>assistant<|channel|>analysis to=python code<|message|>{code}<|call|>"
)


def _python_rule(match: str, code: str) -> dict:
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
        _python_rule("compute", "x = 41\nx + 1"),
        _python_rule("again", "x + 1"),
        _python_rule("loop forever", "while True:\n    pass"),
        _python_rule("memory bomb", "b = bytearray(8 * 1024 ** 3)"),
        _python_rule(
            "fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
        ),
        _python_rule("keep calling", "1"),
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


def _settings(tmp_path: Path, web: WebFixtures, mcp_url: str, **python: object) -> Settings:
    hosted = {
        "python": {"enabled": True, "wall_s": 2, "python": _sandbox_python(), "memory_mb": 256, **python},
        "web_search": {"provider": "searxng", "url": web.url},
        "mcp": {"allowed_urls": {"default": [mcp_url]}},
        "outbound": {"allowed_private_networks": ["127.0.0.0/8"]},
    }
    return gateway_settings(tmp_path, SCRIPT, keepalive_s=0.2, hosted_tools=hosted)


@pytest.fixture(params=["memory", "redis"])
def gateway(request, tmp_path, web, mcp_server):
    settings = _settings(tmp_path, web, mcp_server.url)
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        flush(server)
        settings = settings.model_copy(update={"redis_url": server.url})
    live = LiveGateway(settings).start()
    yield live
    live.stop()


@pytest.fixture
def memory_gateway(tmp_path, web, mcp_server):
    live = LiveGateway(_settings(tmp_path, web, mcp_server.url)).start()
    yield live
    live.stop()


def _client(gateway: LiveGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=60)


def _create(api: openai.OpenAI, stream: bool, **body):
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


def _of(response, kind: str) -> list:
    return [item for item in response.output if item.type == kind]


@pytest.mark.parametrize("stream", [False, True])
def test_python_runs_in_the_sandbox_within_one_response_and_keeps_state_along_the_chain(gateway, stream):
    api = _client(gateway)
    first, events = _create(
        api, stream, input="compute the answer", tools=[PYTHON_TOOL], include=["code_interpreter_call.outputs"]
    )
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["reasoning", "code_interpreter_call", "message"]
    call = _of(first, "code_interpreter_call")[0]
    assert call.code == "x = 41\nx + 1" and call.status == "completed"
    assert call.outputs[0].logs == "42\n" and call.container_id.startswith("cntr_")
    assert first.output_text == "The answer is 42."
    assert first.usage.input_tokens > first.usage.output_tokens  # two samplings' prompts
    if stream:
        kinds = [event.type for event in events]
        expected = [
            "response.code_interpreter_call.in_progress",
            "response.code_interpreter_call_code.delta",
            "response.code_interpreter_call_code.done",
            "response.code_interpreter_call.interpreting",
            "response.code_interpreter_call.completed",
        ]
        positions = [kinds.index(kind) for kind in expected]
        assert positions == sorted(positions)
        done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "code_interpreter_call"]
        assert done[0].item.outputs[0].logs == "42\n"
    # the model's prompt held the tool's answer as python's Harmony message, in the same turn
    prompt = gateway.backend.prompt_text()
    assert "<|start|>python to=assistant<|channel|>analysis<|message|>42\n<|end|>" in prompt
    assert "## python" in prompt.split("<|end|>")[0]  # the system message offers it
    # the next response of the chain finds the sandbox's state (x = 41)
    second, _ = _create(
        api,
        False,
        input="again",
        tools=[PYTHON_TOOL],
        previous_response_id=first.id,
        include=["code_interpreter_call.outputs"],
    )
    assert _of(second, "code_interpreter_call")[0].outputs[0].logs == "42\n"
    assert _of(second, "code_interpreter_call")[0].container_id == call.container_id
    stored = api.responses.retrieve(second.id)
    assert [item.type for item in stored.output] == [item.type for item in second.output]


def _healthz_ms(url: str) -> float:
    started = time.monotonic()
    urllib.request.urlopen(url + "/healthz", timeout=5).read()
    return (time.monotonic() - started) * 1000


@pytest.mark.parametrize("bomb", ["loop forever", "memory bomb", "fork bomb"])
def test_the_sandbox_stops_runaway_code_and_the_gateway_stays_healthy(memory_gateway, bomb):
    api = _client(memory_gateway)
    slowest: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            slowest.append(_healthz_ms(memory_gateway.url))
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.monotonic()
    try:
        response, _ = _create(api, False, input=bomb, tools=[PYTHON_TOOL], include=["code_interpreter_call.outputs"])
    finally:
        stop.set()
        prober.join()
    elapsed = time.monotonic() - started
    call = _of(response, "code_interpreter_call")[0]
    assert call.status == "failed"
    assert response.output_text == "It failed."
    logs = call.outputs[0].logs
    if bomb == "memory bomb":
        assert "MemoryError" in logs and elapsed < 2  # refused at once by the address-space limit
    else:
        assert "timed out after 2 s" in logs and elapsed < 6
    assert max(slowest) < 1000, slowest  # the event loop kept answering
    uid_base = memory_gateway.settings.hosted_tools.python.uid_base
    if os.getuid() == 0:  # nothing of the sandbox survives it (as root each sandbox has its own uid)
        time.sleep(0.3)
        owners = [int(line.split()[0]) for line in os.popen("ps -eo uid=").read().splitlines() if line.strip()]
        assert not [uid for uid in owners if uid_base <= uid < uid_base + 16 and bomb != "memory bomb"]


def test_the_sandbox_has_no_network_where_the_os_allows_it(memory_gateway, web):
    pool = memory_gateway.services.hosted.sandboxes
    code = f"import urllib.request\nurllib.request.urlopen('{web.url}/pages/tides', timeout=2).read()[:5]"
    result = memory_gateway.call(pool.run("tenant-a", "cntr_net", code))
    sandbox_isolated = memory_gateway.call(_isolation(pool, "cntr_net"))
    if sandbox_isolated:
        assert result.failed and ("unreachable" in result.output or "URLError" in result.output)
    else:
        pytest.fail("this machine allows network namespaces; the sandbox did not get one")


async def _isolation(pool, container_id):
    return pool._sandboxes[container_id].network_isolated


def test_max_tool_calls_stops_the_loop(memory_gateway):
    api = _client(memory_gateway)
    response, _ = _create(api, False, input="keep calling", tools=[PYTHON_TOOL], max_tool_calls=1)
    calls = _of(response, "code_interpreter_call")
    assert response.status == "completed"
    assert [call.status for call in calls] == ["completed"] + ["incomplete"] * (len(calls) - 1)
    assert len(calls) == 4  # one run; three refused (the model was told), then the loop stops
    assert not _of(response, "message")


SEARCH_TOOL = {"type": "web_search"}


@pytest.mark.parametrize("stream", [False, True])
def test_web_search_runs_as_harmonys_browser_and_cites_pages(gateway, web, stream):
    api = _client(gateway)
    response, events = _create(
        api,
        stream,
        input="search the web: what causes tides?",
        tools=[SEARCH_TOOL],
        include=["web_search_call.action.sources"],
    )
    searches = _of(response, "web_search_call")
    assert [call.action.type for call in searches] == ["search", "open_page"]
    assert searches[0].action.query == "what causes tides" and web.queries[-1] == "what causes tides"
    assert searches[1].action.url == f"{web.url}/pages/tides"
    assert all(call.status == "completed" for call in searches)
    message = _of(response, "message")[0]
    text = message.content[0].text
    assert text == "The Moon causes tides【1†L2】."
    (citation,) = message.content[0].annotations
    assert citation.type == "url_citation" and citation.url == f"{web.url}/pages/tides"
    assert text[citation.start_index : citation.end_index] == "【1†L2】"
    prompt = gateway.backend.prompt_text()
    assert (
        "<|start|>browser.search to=assistant<|channel|>analysis<|message|>[0] Search results for `what causes tides`"
        in prompt
    )
    assert "L2: Tides are caused mainly by the gravity of the Moon." in prompt  # the page, as numbered lines
    assert "var x" not in prompt  # scripts are not page text
    if stream:
        kinds = [event.type for event in events]
        for kind in ("in_progress", "searching", "completed"):
            assert kinds.count(f"response.web_search_call.{kind}") == 2
        assert "response.output_text.annotation.added" in kinds


def test_the_browser_does_not_reach_addresses_the_operator_did_not_allow(memory_gateway):
    api = _client(memory_gateway)
    response, _ = _create(api, False, input="read the cloud metadata", tools=[SEARCH_TOOL])
    (call,) = _of(response, "web_search_call")
    assert call.status == "failed"
    assert "may not reach" in memory_gateway.backend.prompt_text()


def _mcp_tool(server: McpTestServer, **extra) -> dict:
    return {"type": "mcp", "server_label": "calc", "server_url": server.url, **extra}


@pytest.mark.parametrize("stream", [False, True])
def test_an_mcp_server_is_listed_and_called_within_one_response(gateway, mcp_server, stream):
    api = _client(gateway)
    tool = _mcp_tool(mcp_server, require_approval="never", headers={"Authorization": "Bearer secret-token-123"})
    response, events = _create(api, stream, input="add 2 and 3", tools=[tool])
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listing = response.output[0]
    assert listing.server_label == "calc" and {t.name for t in listing.tools} == {"add", "whoami", "fail"}
    call = response.output[1]
    assert (call.name, json.loads(call.arguments), call.output, call.status) == (
        "add",
        {"a": 2, "b": 3},
        "5",
        "completed",
    )
    assert response.output_text == "2 + 3 = 5"
    assert "namespace calc {" in gateway.backend.prompt_text()  # rendered as its own Harmony namespace
    if stream:
        kinds = [event.type for event in events]
        for kind in (
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.mcp_call.in_progress",
            "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done",
            "response.mcp_call.completed",
        ):
            assert kind in kinds
    # secrets: not echoed, not stored, not logged
    stored = api.responses.retrieve(response.id)
    assert "headers" not in stored.tools[0].model_dump(exclude_unset=True)
    assert "secret-token-123" not in json.dumps(stored.model_dump(mode="json"))
    # the next turn does not list the tools again: the client holds the list
    follow, _ = _create(api, False, input="add 2 and 3", tools=[tool], previous_response_id=response.id)
    assert [item.type for item in follow.output] == ["mcp_call", "message"]


def test_a_clients_token_reaches_the_mcp_server_and_a_failing_tool_is_an_mcp_error(memory_gateway, mcp_server):
    api = _client(memory_gateway)
    tool = _mcp_tool(mcp_server, require_approval="never", authorization="secret-token-123")
    response, _ = _create(api, False, input="who am I", tools=[tool])
    assert _of(response, "mcp_call")[0].output == "authorized"
    broken, _ = _create(api, False, input="broken tool", tools=[tool])
    call = _of(broken, "mcp_call")[0]
    assert call.status == "failed" and call.error.type == "mcp_tool_execution_error"
    assert broken.output_text == "The tool failed."


@pytest.mark.parametrize("approve", [True, False])
def test_an_approval_round_trip(gateway, mcp_server, approve):
    api = _client(gateway)
    tool = _mcp_tool(mcp_server)  # require_approval defaults to always, as OpenAI's
    calls_before = len(mcp_server.calls)
    first, _ = _create(api, False, input="add 2 and 3", tools=[tool])
    request = _of(first, "mcp_approval_request")[0]
    assert (request.name, json.loads(request.arguments), request.server_label) == ("add", {"a": 2, "b": 3}, "calc")
    assert len(mcp_server.calls) == calls_before  # nothing ran yet
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve}
    second, _ = _create(api, False, input=[answer], tools=[tool], previous_response_id=first.id)
    if approve:
        call = _of(second, "mcp_call")[0]
        assert call.approval_request_id == request.id and call.output == "5"
        assert second.output_text == "2 + 3 = 5"
        assert mcp_server.calls[-1] == {"tool": "add", "a": 2, "b": 3}
    else:
        assert not _of(second, "mcp_call") and second.output_text == "Understood, not adding."
        assert len(mcp_server.calls) == calls_before
    with pytest.raises(openai.BadRequestError) as again:  # an answered request cannot be answered twice
        api.responses.create(model=MODEL, input=[answer], tools=[tool], previous_response_id=second.id)
    assert again.value.body["param"] == "input[0].approval_request_id"


def test_an_mcp_url_outside_the_allow_list_is_a_400(memory_gateway, mcp_server):
    api = _client(memory_gateway)
    for url in ("http://127.0.0.1:1/elsewhere", mcp_server.url + "-evil", "file:///etc/passwd"):
        with pytest.raises(openai.BadRequestError) as refused:
            api.responses.create(model=MODEL, input="add", tools=[{**_mcp_tool(mcp_server), "server_url": url}])
        assert refused.value.body["param"] == "tools[0].server_url"


def test_tools_the_operator_did_not_enable_are_not_offered(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, SCRIPT)).start()
    try:
        raw = _client(live).responses.with_raw_response.create(
            model=MODEL, input="compute the answer", tools=[PYTHON_TOOL, SEARCH_TOOL]
        )
        assert raw.headers["X-Gateway-Tools-Not-Offered"] == "code_interpreter, web_search"
        assert "## python" not in live.backend.prompt_text()
    finally:
        live.stop()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_the_agents_sdks_hosted_tool_classes_work_unmodified(memory_gateway, mcp_server, streamed):
    from agents import (
        Agent,
        CodeInterpreterTool,
        HostedMCPTool,
        MCPToolApprovalFunctionResult,
        OpenAIResponsesModel,
        Runner,
        WebSearchTool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    approvals: list[str] = []

    def approve(request) -> MCPToolApprovalFunctionResult:
        approvals.append(request.data.name)
        return {"approve": True}

    client = openai.AsyncOpenAI(base_url=memory_gateway.url + "/v1", api_key="sk-agents", max_retries=0)
    tools = [
        CodeInterpreterTool(tool_config={"type": "code_interpreter", "container": {"type": "auto"}}),
        WebSearchTool(),
        HostedMCPTool(tool_config=_mcp_tool(mcp_server), on_approval_request=approve),
    ]
    agent = Agent(name="helper", model=OpenAIResponsesModel(model=MODEL, openai_client=client), tools=tools)

    async def run(question: str) -> str:
        if not streamed:
            return (await Runner.run(agent, question)).final_output
        result = Runner.run_streamed(agent, question)
        async for _ in result.stream_events():
            pass
        return result.final_output

    async def scenario() -> list[str]:
        return [await run(q) for q in ("compute the answer", "search the web: tides?", "add 2 and 3")]

    answers = asyncio.run(scenario())
    assert answers == ["The answer is 42.", "The Moon causes tides【1†L2】.", "2 + 3 = 5"]
    assert approvals == ["add"]  # the SDK's approval callback answered the gateway's approval request


def test_an_approval_of_an_unknown_request_is_a_400(memory_gateway, mcp_server):
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_nothing", "approve": True}
    with pytest.raises(openai.BadRequestError) as refused:
        _client(memory_gateway).responses.create(model=MODEL, input=[answer], tools=[_mcp_tool(mcp_server)])
    assert refused.value.body["param"] == "input[0].approval_request_id"


def test_a_container_serves_its_own_tenant_alone(memory_gateway):
    pool = memory_gateway.services.hosted.sandboxes
    assert not memory_gateway.call(pool.run("tenant-a", "cntr_mine", "secret = 7")).failed
    other = memory_gateway.call(pool.run("tenant-b", "cntr_mine", "secret"))
    assert other.failed and "not available" in other.output and "7" not in other.output
    assert memory_gateway.call(pool.run("tenant-a", "cntr_mine", "secret")).output == "7\n"


def test_settings_name_what_a_search_provider_lacks():
    with pytest.raises(ValueError, match=r"GATEWAY_HOSTED_TOOLS.*searxng provider needs"):
        load_settings(hosted_tools={"web_search": {"provider": "searxng"}})


def test_an_interpreter_the_sandbox_uid_cannot_read_is_refused_with_the_reason():
    if _sandbox_python() == sys.executable:
        pytest.skip("this interpreter's standard library is readable by every user here")
    from gateway.hosted.sandbox import SandboxPool, SandboxSettings, SandboxUnavailable

    async def start() -> None:
        pool = SandboxPool(SandboxSettings(enabled=True, python=sys.executable))
        try:
            with pytest.raises(SandboxUnavailable, match="cannot read"):
                await pool.run("tenant-a", "cntr_x", "1")
        finally:
            await pool.aclose()

    asyncio.run(start())


def test_the_system_message_offers_the_built_in_tools_token_exact_as_the_reference_renders_it(memory_gateway):
    from datetime import UTC, datetime

    from reference import harmony_module, reference_encoding

    oh = harmony_module()
    _client(memory_gateway).responses.create(model=MODEL, input="hello", tools=[SEARCH_TOOL, PYTHON_TOOL])
    prompt = list(memory_gateway.backend.prompts[-1])
    system = (
        oh.SystemContent.new()
        .with_reasoning_effort(oh.ReasoningEffort.MEDIUM)
        .with_conversation_start_date(datetime.now(UTC).date().isoformat())
        .with_browser_tool()
        .with_python_tool()
    )
    expected = reference_encoding().render(oh.Message.from_role_and_content(oh.Role.SYSTEM, system))
    assert prompt[: len(expected)] == expected


def test_brave_search_api_is_the_hosted_provider(web):
    from gateway.hosted.search import BraveProvider, SearchFailed
    from gateway.hosted.settings import SearchSettings

    async def search(key: str) -> list:
        provider = BraveProvider(SearchSettings(provider="brave", url=web.url + "/res/v1", api_key=key))
        try:
            return await provider.search("tides", 3)
        finally:
            await provider.aclose()

    results = asyncio.run(search("brave-key"))
    assert [r.url for r in results] == [f"{web.url}/pages/{i}" for i in range(3)] and web.queries[-1] == "tides"
    with pytest.raises(SearchFailed, match="HTTP 401"):
        asyncio.run(search("wrong-key"))


def test_mcp_over_sse_too(tmp_path, web):
    server = McpTestServer(transport="sse").start()
    live = LiveGateway(_settings(tmp_path, web, server.url)).start()
    try:
        tool = {"type": "mcp", "server_label": "calc", "server_url": server.url, "require_approval": "never"}
        response, _ = _create(_client(live), False, input="add 2 and 3", tools=[tool])
        assert _of(response, "mcp_call")[0].output == "5" and response.output_text == "2 + 3 = 5"
    finally:
        live.stop()
        server.stop()


def test_an_idle_sandbox_is_dropped(tmp_path, web, mcp_server):
    live = LiveGateway(_settings(tmp_path, web, mcp_server.url, idle_s=0.2)).start()
    try:
        pool = live.services.hosted.sandboxes
        assert live.call(pool.run("tenant-a", "cntr_idle", "x = 1")).output == ""
        time.sleep(1.0)
        assert "NameError" in live.call(pool.run("tenant-a", "cntr_idle", "x")).output  # a fresh sandbox
    finally:
        live.stop()


def test_page_fetches_are_bounded_and_every_redirect_hop_is_checked(web):
    from gateway.hosted.outbound import OutboundPolicy, OutboundRefused, OutboundSettings, PageFetcher

    settings = OutboundSettings(allowed_private_networks=["127.0.0.0/8"], max_page_bytes=100_000)
    fetcher = PageFetcher(OutboundPolicy.from_settings(settings), settings)

    async def fetch(path: str):
        return await fetcher.fetch(web.url + path)

    async def scenario() -> None:
        try:
            big = await fetch("/pages/big")
            assert big.truncated and len(big.text.encode()) == 100_000
            with pytest.raises(OutboundRefused, match="may not reach"):  # 127.0.0.1 allowed, 169.254 not
                await fetch("/pages/redirect")
        finally:
            await fetcher.aclose()

    asyncio.run(scenario())


def test_tool_lists_are_cached_per_tenant_and_credentials_and_tokens_stay_out_of_logs(
    memory_gateway, mcp_server, capfd
):
    # approvals: the responses end at an approval request, so the only listings are the gateway's own (a tool
    # call lists too: the SDK checks the result against the tool's output schema)
    tool = _mcp_tool(mcp_server, authorization="secret-token-123")
    api_a = _client(memory_gateway)
    api_b = openai.OpenAI(base_url=memory_gateway.url + "/v1", api_key="sk-tenant-b", max_retries=0, timeout=60)
    before = mcp_server.listings
    for _ in range(3):
        _create(api_a, False, input="who am I", tools=[tool])
    assert mcp_server.listings == before + 1  # listed once for tenant-a, then from the cache
    _create(api_b, False, input="who am I", tools=[tool])
    assert mcp_server.listings == before + 2  # another tenant lists for itself
    _create(api_a, False, input="who am I", tools=[{**tool, "authorization": "another-token"}])
    assert mcp_server.listings == before + 3  # other credentials, another list
    captured = capfd.readouterr()
    assert "secret-token-123" not in captured.out + captured.err
    assert "who am I" not in captured.out + captured.err  # nor prompts


def test_an_allowed_mcp_url_on_a_private_address_is_still_refused_unless_its_network_is_allowed(
    tmp_path, web, mcp_server
):
    settings = _settings(tmp_path, web, mcp_server.url)
    hosted = settings.hosted_tools.model_copy(
        update={"outbound": settings.hosted_tools.outbound.model_copy(update={"allowed_private_networks": []})}
    )
    live = LiveGateway(settings.model_copy(update={"hosted_tools": hosted})).start()
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            _client(live).responses.create(model=MODEL, input="add", tools=[_mcp_tool(mcp_server)])
        assert refused.value.status_code == 424
        assert refused.value.body["param"] == "tools[0].server_url"
        assert "may not reach" in refused.value.body["message"]
    finally:
        live.stop()


def test_the_tool_time_budget_of_a_response_cuts_a_running_call(tmp_path, web, mcp_server):
    settings = _settings(tmp_path, web, mcp_server.url, wall_s=30)
    hosted = settings.hosted_tools.model_copy(update={"max_seconds": 1.0})
    live = LiveGateway(settings.model_copy(update={"hosted_tools": hosted})).start()
    try:
        started = time.monotonic()
        response, _ = _create(_client(live), False, input="loop forever", tools=[PYTHON_TOOL])
        assert time.monotonic() - started < 5  # the 1 s budget, not the 30 s cell limit
        assert _of(response, "code_interpreter_call")[0].status == "failed"
        assert "ran past this response's time for tools" in live.backend.prompt_text()
        assert response.output_text == "The tool failed."
    finally:
        live.stop()


def test_a_full_pool_drops_its_least_recently_used_sandbox(tmp_path, web, mcp_server):
    live = LiveGateway(_settings(tmp_path, web, mcp_server.url, max_sandboxes=1)).start()
    try:
        pool = live.services.hosted.sandboxes
        live.call(pool.run("tenant-a", "cntr_one", "kept = 1"))
        live.call(pool.run("tenant-a", "cntr_two", "other = 2"))  # the pool is full: cntr_one goes
        assert "NameError" in live.call(pool.run("tenant-a", "cntr_one", "kept")).output
    finally:
        live.stop()
