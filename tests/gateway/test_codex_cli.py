"""OpenAI's Codex CLI (npm `@openai/codex`, pinned) against a live gateway, unmodified: a custom model provider
with `wire_api = "responses"` and Codex's default tools (multi-agent namespace, web_search) runs a shell
command that creates a file; with a model entry that turns on its freeform `apply_patch` (a custom tool with
a Lark grammar, plus tool_search), it adds a file with a patch. Codex sends `store: false` and carries the
chain of thought back as encrypted reasoning items, so the second request of each run must hold the first
turn's analysis. The package is installed once into a cache; the test skips only when npm cannot reach its
registry, and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway

CODEX_VERSION = "0.169.0"
CACHE = Path(os.environ.get("CODEX_CACHE_DIR", Path.home() / ".cache" / "gpt-oss-gateway-tests" / "codex"))
MODEL = "gpt-oss-120b"
ANALYSIS_SHELL = "The user wants hello.txt; one echo into it does that."
ANALYSIS_PATCH = "An apply_patch that adds notes.txt is the way to do this."
PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+written by a patch\n*** End Patch\n"
SCRIPT = {
    "rules": [
        {"match": {"tool": "notes.txt"}, "emit": [{"final": "Added notes.txt."}]},
        {"match": {"tool": "(?s)."}, "emit": [{"final": "Created hello.txt."}]},
        {
            "match": {"user": "create hello.txt"},
            "emit": [
                {"analysis": ANALYSIS_SHELL},
                {"commentary": "Creating the file."},
                {"tool_call": {"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}},
            ],
        },
        {
            "match": {"user": "add notes"},
            "emit": [{"analysis": ANALYSIS_PATCH}, {"tool_call": {"name": "apply_patch", "input": PATCH}}],
        },
        {"emit": [{"final": "Nothing to do."}]},
    ]
}
CATALOG = {  # Codex's model metadata (`model_catalog_json`), as a user writes it to enable freeform apply_patch
    "models": [
        {
            "slug": MODEL,
            "display_name": MODEL,
            "description": None,
            "supported_reasoning_levels": [
                {"effort": effort, "description": effort} for effort in ("low", "medium", "high")
            ],
            "shell_type": "shell_command",
            "visibility": "list",
            "supported_in_api": True,
            "priority": 1,
            "upgrade": None,
            "base_instructions": "You are a coding agent. Edit files with apply_patch.",
            "supports_reasoning_summaries": False,
            "support_verbosity": False,
            "default_verbosity": None,
            "apply_patch_tool_type": "freeform",
            "truncation_policy": {"mode": "tokens", "limit": 10000},
            "supports_parallel_tool_calls": False,
            "context_window": 131072,
            "experimental_supported_tools": [],
            "supports_search_tool": True,
        }
    ]
}


@pytest.fixture(scope="module")
def codex() -> Path:
    binary = CACHE / CODEX_VERSION / "node_modules" / ".bin" / "codex"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    assert npm, "npm is not installed (Node.js comes with it)"
    try:
        subprocess.run(
            [npm, "view", f"@openai/codex@{CODEX_VERSION}", "version"], check=True, capture_output=True, timeout=60
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"the npm registry cannot be reached, so Codex CLI cannot be installed: {exc}")
    prefix = CACHE / CODEX_VERSION
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"@openai/codex@{CODEX_VERSION}"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return binary


@pytest.fixture
def gateway(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, SCRIPT)).start()
    yield live
    live.stop()


def _run_codex(
    codex: Path, gateway: LiveGateway, home: Path, workdir: Path, prompt: str, catalog: bool, websockets: bool = False
) -> str:
    home.mkdir()
    workdir.mkdir()
    lines = [f'model = "{MODEL}"', 'model_provider = "gateway"']
    if catalog:
        (home / "catalog.json").write_text(json.dumps(CATALOG))
        lines.append(f'model_catalog_json = "{home / "catalog.json"}"')
    lines += [
        "[model_providers.gateway]",
        'name = "gpt-oss-gateway"',
        f'base_url = "{gateway.url}/v1"',
        'wire_api = "responses"',
        'env_key = "GATEWAY_API_KEY"',
        f"supports_websockets = {str(websockets).lower()}",
    ]
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_API_KEY": "sk-test", "HOME": str(home)}
    done = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def _developer(prompt: str) -> str:
    """The developer message of a rendered prompt (Codex's instructions and tools)."""
    start = "<|start|>developer<|message|>"
    return prompt.split(start, 1)[1].split("<|end|>", 1)[0] if start in prompt else ""


def _codex_prompts(gateway: LiveGateway) -> list[str]:
    prompts = [gateway.backend.prompt_text(i) for i in range(len(gateway.backend.prompts))]
    return [prompt for prompt in prompts if "Codex" in prompt or "apply_patch" in prompt]


@pytest.mark.parametrize("websockets", [False, True], ids=["sse", "websocket"])
def test_codex_runs_a_shell_command_with_its_default_tools(codex, gateway, tmp_path, websockets):
    """Over SSE, and over the Responses WebSocket (`supports_websockets` on the provider)."""
    home, work = tmp_path / "home", tmp_path / "work"
    output = _run_codex(codex, gateway, home, work, "create hello.txt", catalog=False, websockets=websockets)
    assert (tmp_path / "work" / "hello.txt").read_text() == "hi\n"
    assert "Created hello.txt." in output
    first, second = _codex_prompts(gateway)[-2:]
    assert "namespace multi_agent_v1 {" in first and "type exec_command" in first  # its namespace, rendered
    assert "web_search" not in first  # not offered: nothing here runs it
    assert ANALYSIS_SHELL in second  # carried back by Codex as an encrypted reasoning item (store: false)
    assert "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json" in second
    sockets = sum(
        sample.value
        for family in gateway.services.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "gateway_websocket_responses_total" and sample.labels["status"] in ("completed", "prepared")
    )
    assert (sockets >= 2) == websockets  # its turns went over the socket, or none did
    assert _developer(second) == _developer(first) != ""  # its instructions hold on a socket's continuation too


def test_codex_adds_a_file_with_its_freeform_apply_patch(codex, gateway, tmp_path):
    output = _run_codex(codex, gateway, tmp_path / "home", tmp_path / "work", "add notes", catalog=True)
    assert (tmp_path / "work" / "notes.txt").read_text() == "written by a patch\n"
    assert "Added notes.txt." in output
    first, second = _codex_prompts(gateway)[-2:]
    assert "type apply_patch = (_: string) => any;" in first and "// start: begin_patch hunk+ end_patch" in first
    assert "tool_search" not in first
    assert ANALYSIS_PATCH in second
    assert f"<|start|>assistant<|channel|>commentary to=functions.apply_patch<|message|>{PATCH}<|call|>" in second


def test_codex_finishes_its_task_when_the_gateway_closes_its_socket_mid_conversation(codex, tmp_path):
    """The socket's lifetime runs out while the first turn streams: the gateway finishes that turn and closes
    the socket. Codex must reconnect and, its `store: false` chain gone with the old socket, send the whole
    context (a `previous_response_id` there would get `previous_response_not_found`)."""
    slow_first_turn = {**SCRIPT["rules"][2], "token_delay_ms": 40}
    script = {"rules": [*SCRIPT["rules"][:2], slow_first_turn, *SCRIPT["rules"][3:]]}
    live = LiveGateway(gateway_settings(tmp_path, script, ws_max_age_s=1.0)).start()
    try:
        home, work = tmp_path / "home", tmp_path / "work"
        output = _run_codex(codex, live, home, work, "create hello.txt", catalog=False, websockets=True)
        assert (work / "hello.txt").read_text() == "hi\n"
        assert "Created hello.txt." in output
        second = _codex_prompts(live)[-1]
        assert ANALYSIS_SHELL in second and "echo hi > hello.txt" in second  # the whole context, resent
        samples = [sample for family in live.services.metrics.registry.collect() for sample in family.samples]
        statuses = {s.labels["status"]: s.value for s in samples if s.name == "gateway_websocket_responses_total"}
        assert statuses.get("completed", 0) >= 2  # both turns over a socket
        upgrades = [s.value for s in samples if s.name == "gateway_requests_total" and s.labels["status"] == "101"]
        assert sum(upgrades) >= 2  # the first socket closed mid-conversation; Codex opened another
    finally:
        live.stop()
