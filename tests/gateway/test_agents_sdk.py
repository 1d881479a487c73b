"""The real OpenAI Agents SDK (Python) running a tool loop through the gateway's Responses API."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from gateway_fixtures import ANALYSIS_WEATHER
from openai import AsyncOpenAI

set_tracing_disabled(True)
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    calls.append(city)
    return "sunny"


def _agent(gateway, api: str) -> Agent:
    client = AsyncOpenAI(base_url=gateway.url + "/v1", api_key="sk-agents", max_retries=0)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    model = kind(model="gpt-oss-120b", openai_client=client)
    return Agent(name="weather", instructions="You answer weather questions.", tools=[get_weather], model=model)


async def _run_streamed(agent: Agent, question: str) -> tuple[str, list[str]]:
    result = Runner.run_streamed(agent, question)
    kinds = [event.data.type async for event in result.stream_events() if event.type == "raw_response_event"]
    return result.final_output, kinds


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agent_tool_loop_replays_the_chain_of_thought(gateway, streamed, api):
    calls.clear()
    agent = _agent(gateway, api)
    if streamed:
        final, kinds = asyncio.run(_run_streamed(agent, "What is the weather in Paris?"))
        if api == "responses":
            assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    else:
        final = Runner.run_sync(agent, "What is the weather in Paris?").final_output
    assert final == "It is sunny in Paris." and calls == ["Paris"]
    prompt = gateway.backend.prompt_text()
    assert ANALYSIS_WEATHER in prompt  # turn 2 (a full replay, no previous_response_id) carries turn 1's CoT
    assert prompt.count(ANALYSIS_WEATHER) == 1
    assert "You answer weather questions." in prompt
