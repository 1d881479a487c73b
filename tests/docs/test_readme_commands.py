"""The README's commands run as written: its Python example (a tool turn through the Responses API) against a live
gateway, and its serve command is the one tests/engine/test_engine_default.py starts the gateway with."""

from __future__ import annotations

import re
from pathlib import Path

from gateway_fixtures import SCRIPT, TEST_KEYS, write_script
from live_gateway import LiveGateway

from gateway.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
README_URL = "http://127.0.0.1:8000/v1"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_python_example_runs_a_tool_turn_against_a_live_gateway(tmp_path):
    (example,) = _blocks("python")
    assert README_URL in example
    settings = Settings(mock_script=str(write_script(tmp_path, SCRIPT)), reasoning_keys=TEST_KEYS, auth="off")
    gateway = LiveGateway(settings).start()
    printed: list[tuple] = []
    namespace: dict = {"print": lambda *values: printed.append(values)}  # the gateway logs to stdout here
    try:
        exec(compile(example.replace(README_URL, gateway.url + "/v1"), "README.md", "exec"), namespace)
    finally:
        gateway.stop()
    first, second = namespace["first"], namespace["second"]
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content[0].text  # the raw chain of thought, as the comment says
    assert second.status == "completed" and printed == [("It is sunny in Paris.",)]


def test_the_shell_commands_are_the_ones_the_tests_and_ci_run():
    serve, tests = _blocks("sh")[:2]
    assert serve.strip().endswith(".venv/bin/gpt-oss-gateway serve")  # test_engine_default.py starts it so
    test_command = ".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    assert test_command in tests and test_command in (ROOT / ".ci" / "run").read_text()
