"""The sandboxes' memory where the gateway cannot make cgroups (uid 10001, as the Helm chart runs it, on a host
that delegates none): python is offered only when its per-process bounds (memory_mb x processes x max_sandboxes)
fit the replica's memory budget; /readyz and the start-up log say which bound holds; a cell allocating past
memory_mb is stopped, and the gateway goes on answering its other tenants."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
from hosted_gateway import MODEL, PYTHON_TOOL, of, python_rule
from live_gateway import GatewayProcess
from unprivileged import SYSTEM_PYTHON, unprivileged_gateway, write_readable

HOG = "block = bytearray(400 << 20)\nlen(block)"  # past a 128 MiB address space
FORKED = (
    "import os\nchildren = []\n"
    "for _ in range(3):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        try:\n            block = bytearray(400 << 20)\n            os._exit(0)\n"
    "        except MemoryError:\n            os._exit(7)\n"
    "    children.append(pid)\n"
    "sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children)"
)
SCRIPT = {
    "rules": [
        {"match": {"tool": "."}, "emit": [{"final": "Noted."}]},
        python_rule("hog", HOG),
        python_rule("forked", FORKED),
        {"emit": [{"final": "Hello."}]},
    ]
}


def _gateway(directory: Path, **python: object) -> GatewayProcess:
    directory.mkdir(mode=0o755)
    settings = {"enabled": True, "wall_s": 10, "python": SYSTEM_PYTHON, "isolation": "strict", **python}
    env = {
        "GATEWAY_MOCK_SCRIPT": str(write_readable(directory / "script.json", SCRIPT)),
        "GATEWAY_HOSTED_TOOLS": json.dumps({"python": settings}),
    }
    return unprivileged_gateway(directory, env).start()


def _readyz(gateway: GatewayProcess) -> dict:
    with urllib.request.urlopen(gateway.url + "/readyz", timeout=30) as response:
        return json.loads(response.read())


def _cell(gateway: GatewayProcess, text: str, key: str = "sk-tenant-a") -> str | None:
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=60)
    response = api.responses.create(model=MODEL, input=text, tools=[PYTHON_TOOL])
    calls = of(response, "code_interpreter_call")
    return calls[0].outputs[0].logs if calls and calls[0].outputs else None


def test_python_is_not_offered_where_its_per_process_bounds_exceed_the_budget(shared_dir):
    gateway = _gateway(shared_dir / "gw", memory_mb=512, processes=16, max_sandboxes=16, memory_budget_mb=1024)
    try:
        python = _readyz(gateway)["python"]
        assert python["offered"] is False and "memory_budget_mb" in python["reason"]
        assert python["memory"] == {
            "bound": "per_process", "sandbox_mb": 8192, "replica_mb": 131072, "budget_mb": 1024, "fits": False
        }  # fmt: skip
        assert _cell(gateway, "hog") is None  # the tool is left out of the prompt, and nothing ran
    finally:
        gateway.stop()
    log = (shared_dir / "gw" / "gateway.log").read_text()
    assert "python_not_offered" in log and '"bound":"per_process"' in log


def test_a_cell_past_memory_mb_is_stopped_and_the_gateway_answers_its_other_tenants(shared_dir):
    gateway = _gateway(shared_dir / "gw", memory_mb=128, processes=4, max_sandboxes=2)
    try:
        python = _readyz(gateway)["python"]
        assert python["offered"] is True and python["memory"]["bound"] == "per_process"
        assert python["memory"]["sandbox_mb"] == 512 and python["memory"]["replica_mb"] == 1024
        assert "MemoryError" in (_cell(gateway, "hog") or "")
        assert (_cell(gateway, "forked") or "").strip() == "[7, 7, 7]"  # every child held to its own 128 MiB
        other = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-b", max_retries=0, timeout=60)
        assert other.responses.create(model=MODEL, input="hello").output_text == "Hello."
        assert _readyz(gateway)["status"] == "ready"
    finally:
        gateway.stop()
