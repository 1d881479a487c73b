"""Server-side tools through the real `openai` SDK against a live gateway: what is offered, the Agents SDK's
hosted tool classes, the system message, and the response's budget for tool time."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from gateway_fixtures import gateway_settings
from hosted_gateway import (
    MODEL,
    PYTHON_TOOL,
    SCRIPT,
    SEARCH_TOOL,
    client,
    create,
    hosted_settings,
    mcp_tool,
    of,
)
from live_gateway import LiveGateway


def test_tools_the_operator_did_not_enable_are_not_offered(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, SCRIPT)).start()
    try:
        raw = client(live).responses.with_raw_response.create(
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
        HostedMCPTool(tool_config=mcp_tool(mcp_server), on_approval_request=approve),
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


def test_the_system_message_offers_the_built_in_tools_token_exact_as_the_reference_renders_it(memory_gateway):
    from datetime import UTC, datetime

    from reference import harmony_module, reference_encoding

    oh = harmony_module()
    client(memory_gateway).responses.create(model=MODEL, input="hello", tools=[SEARCH_TOOL, PYTHON_TOOL])
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


def test_the_tool_time_budget_of_a_response_cuts_a_running_call(tmp_path, web, mcp_server):
    settings = hosted_settings(tmp_path, web, mcp_server.url, wall_s=30)
    hosted = settings.hosted_tools.model_copy(update={"max_seconds": 1.0})
    live = LiveGateway(settings.model_copy(update={"hosted_tools": hosted})).start()
    try:
        started = time.monotonic()
        response, _ = create(client(live), False, input="loop forever", tools=[PYTHON_TOOL])
        assert time.monotonic() - started < 5  # the 1 s budget, not the 30 s cell limit
        assert of(response, "code_interpreter_call")[0].status == "failed"
        assert "ran past this response's time for tools" in live.backend.prompt_text()
        assert response.output_text == "The tool failed."
    finally:
        live.stop()
