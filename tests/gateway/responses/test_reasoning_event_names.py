"""The reasoning stream events' names: OpenAI's (`response.reasoning_text.*`, what the SDKs read) by default,
the Open Responses spec's (`response.reasoning.*`) when the operator sets GATEWAY_REASONING_STREAM_EVENTS."""

from __future__ import annotations

import openai
import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway


@pytest.mark.parametrize("names", ["reasoning_text", "reasoning"])
def test_reasoning_events_carry_the_configured_names(tmp_path, names):
    live = LiveGateway(gateway_settings(tmp_path, reasoning_stream_events=names)).start()
    try:
        api = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0)
        events = list(api.responses.create(model="gpt-oss-120b", input="thanks", stream=True))
    finally:
        live.stop()
    kinds = [event.type for event in events]
    other = "reasoning" if names == "reasoning_text" else "reasoning_text"
    assert f"response.{names}.delta" in kinds and f"response.{names}.done" in kinds
    assert not [kind for kind in kinds if kind.startswith(f"response.{other}.")]
    deltas = "".join(event.delta for event in events if event.type == f"response.{names}.delta")
    done = next(event for event in events if event.type == f"response.{names}.done")
    assert deltas == done.text == "The user is thanking me."
    assert events[-1].type == "response.completed"
