"""The clients page's Python examples run as written against a live gateway: the Agents SDK's tool loop."""

from __future__ import annotations

import re
from pathlib import Path

from gateway_fixtures import ANALYSIS_WEATHER, SCRIPT, TEST_KEYS, write_script
from live_gateway import LiveGateway

from gateway.config import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "clients.md").read_text()
PAGE_URL = "http://127.0.0.1:8000/v1"


def test_the_agents_sdk_example_runs_its_tool_loop_against_a_live_gateway(tmp_path):
    (example,) = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)
    assert PAGE_URL in example and "from agents import" in example
    settings = Settings(mock_script=str(write_script(tmp_path, SCRIPT)), reasoning_keys=TEST_KEYS, auth="off")
    gateway = LiveGateway(settings).start()
    printed: list[tuple] = []
    namespace: dict = {"print": lambda *values: printed.append(values)}
    try:
        exec(compile(example.replace(PAGE_URL, gateway.url + "/v1"), "docs/clients.md", "exec"), namespace)
        prompt = gateway.backend.prompt_text()
    finally:
        gateway.stop()
    assert printed == [("It is sunny in Paris.",)]
    assert prompt.count(ANALYSIS_WEATHER) == 1  # the tool turn's prompt carried the first turn's chain of thought
