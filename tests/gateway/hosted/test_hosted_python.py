"""The hosted Python tool (`code_interpreter`) through the real `openai` SDK: code runs in the local sandbox
within one response, runaway code is stopped within its limits, and containers stay with their tenant."""

from __future__ import annotations

import ast
import contextlib
import errno
import os
import threading
import time
from pathlib import Path

import openai
import pytest
from gateway_fixtures import write_script
from hosted_gateway import (
    PYTHON_CALL,
    PYTHON_TOOL,
    client,
    create,
    hosted_settings,
    of,
    python_rule,
)
from live_gateway import LiveGateway
from loop_probe import slowest_healthz_during


@pytest.mark.parametrize("stream", [False, True])
def test_python_runs_in_the_sandbox_within_one_response_and_keeps_state_along_the_chain(gateway, stream):
    api = client(gateway)
    first, events = create(
        api, stream, input="compute the answer", tools=[PYTHON_TOOL], include=["code_interpreter_call.outputs"]
    )
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["reasoning", "code_interpreter_call", "message"]
    call = of(first, "code_interpreter_call")[0]
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
    second, _ = create(
        api,
        False,
        input="again",
        tools=[PYTHON_TOOL],
        previous_response_id=first.id,
        include=["code_interpreter_call.outputs"],
    )
    assert of(second, "code_interpreter_call")[0].outputs[0].logs == "42\n"
    assert of(second, "code_interpreter_call")[0].container_id == call.container_id
    stored = api.responses.retrieve(second.id)
    assert [item.type for item in stored.output] == [item.type for item in second.output]


@pytest.mark.parametrize("bomb", ["loop forever", "memory bomb", "fork bomb"])
def test_the_sandbox_stops_runaway_code_and_the_gateway_stays_healthy(memory_gateway, bomb):
    api = client(memory_gateway)
    started = time.monotonic()
    (response, _), slowest = slowest_healthz_during(
        memory_gateway.url,
        lambda: create(api, False, input=bomb, tools=[PYTHON_TOOL], include=["code_interpreter_call.outputs"]),
    )
    elapsed = time.monotonic() - started
    call = of(response, "code_interpreter_call")[0]
    assert call.status == "failed"
    assert response.output_text == "It failed."
    logs = call.outputs[0].logs
    if bomb == "memory bomb":
        assert "MemoryError" in logs and elapsed < 2  # refused at once by the address-space limit
    else:
        assert "timed out after 2 s" in logs and elapsed < 6
    assert slowest < 1.0, slowest  # the event loop kept answering
    python = memory_gateway.settings.hosted_tools.python
    if os.getuid() == 0 and bomb != "memory bomb":  # nothing of a reset sandbox survives it (its own uid, as root)
        time.sleep(0.3)
        owners = [int(line.split()[0]) for line in os.popen("ps -eo uid=").read().splitlines() if line.strip()]
        assert not [uid for uid in owners if python.uid_base <= uid < python.uid_base + python.uid_range]


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
    return pool._sandboxes[container_id].isolation.network


def test_max_tool_calls_stops_the_loop(memory_gateway):
    api = client(memory_gateway)
    response, _ = create(api, False, input="keep calling", tools=[PYTHON_TOOL], max_tool_calls=1)
    calls = of(response, "code_interpreter_call")
    assert response.status == "completed"
    assert [call.status for call in calls] == ["completed"] + ["incomplete"] * (len(calls) - 1)
    assert len(calls) == 4  # one run; three refused (the model was told), then the loop stops
    assert not of(response, "message")


def test_a_container_serves_its_own_tenant_alone(memory_gateway):
    pool = memory_gateway.services.hosted.sandboxes
    assert not memory_gateway.call(pool.run("tenant-a", "cntr_mine", "secret = 7")).failed
    other = memory_gateway.call(pool.run("tenant-b", "cntr_mine", "secret"))
    assert other.failed and "not available" in other.output and "7" not in other.output
    assert memory_gateway.call(pool.run("tenant-a", "cntr_mine", "secret")).output == "7\n"


def test_an_idle_sandbox_is_dropped(tmp_path, web, mcp_server):
    live = LiveGateway(hosted_settings(tmp_path, web, mcp_server.url, idle_s=0.2)).start()
    try:
        pool = live.services.hosted.sandboxes
        assert live.call(pool.run("tenant-a", "cntr_idle", "x = 1")).output == ""
        time.sleep(1.0)
        assert "NameError" in live.call(pool.run("tenant-a", "cntr_idle", "x")).output  # a fresh sandbox
    finally:
        live.stop()


def test_a_full_pool_drops_its_least_recently_used_sandbox(tmp_path, web, mcp_server):
    live = LiveGateway(hosted_settings(tmp_path, web, mcp_server.url, max_sandboxes=1)).start()
    try:
        pool = live.services.hosted.sandboxes
        live.call(pool.run("tenant-a", "cntr_one", "kept = 1"))
        live.call(pool.run("tenant-a", "cntr_two", "other = 2"))  # the pool is full: cntr_one goes
        assert "NameError" in live.call(pool.run("tenant-a", "cntr_one", "kept")).output
    finally:
        live.stop()


def test_a_running_cell_is_never_evicted_for_another_tenant(tmp_path, web, mcp_server):
    """With every sandbox running a cell, another tenant's new container is told python is busy; the running
    cell finishes (it was killed mid-run before, its sandbox given to the newcomer)."""
    script = {
        "rules": [
            {"match": {"tool": "slow done"}, "emit": [{"final": "The slow cell finished."}]},
            {"match": {"tool": "."}, "emit": [{"final": "Noted."}]},
            python_rule("slow", "import time\ntime.sleep(2.5)\nprint('slow done')"),
            python_rule("quick", "1 + 1"),
        ]
    }
    settings = hosted_settings(tmp_path, web, mcp_server.url, max_sandboxes=1, wall_s=10)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        owner = client(live)
        other = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-b", max_retries=0, timeout=60)
        results: dict[str, object] = {}
        slow = threading.Thread(
            target=lambda: results.update(slow=create(owner, False, input="slow", tools=[PYTHON_TOOL])[0])
        )
        slow.start()
        pool = live.services.hosted.sandboxes
        deadline = time.monotonic() + 10
        while not any(sandbox.busy for sandbox in pool._sandboxes.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        quick, _ = create(other, False, input="quick", tools=[PYTHON_TOOL])
        slow.join(30)
        (refused,) = of(quick, "code_interpreter_call")
        assert refused.status == "failed"
        backend = live.backend
        assert any("python is busy" in backend.prompt_text(i) for i in range(len(backend.prompts)))
        (ran,) = of(results["slow"], "code_interpreter_call")
        assert ran.status == "completed" and ran.outputs[0].logs.strip() == "slow done"
        assert results["slow"].output_text == "The slow cell finished."
    finally:
        live.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="sandboxes get uids of their own only when the gateway runs as root")
def test_files_a_sandbox_leaves_in_shared_directories_never_reach_the_next_tenant_in_its_slot(
    tmp_path, web, mcp_server
):
    """Tenant A's sandbox leaves a 0600 file and a FIFO in /tmp and /dev/shm, then times out; tenant B's next
    sandbox gets the same slot and uid, and finds nothing of A's."""
    plant = (
        "import os\n"
        "for path in ('/tmp/left_by_a', '/dev/shm/left_by_a'):\n"
        "    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600); os.write(fd, b'secret of a'); os.close(fd)\n"
        "os.mkfifo('/tmp/fifo_by_a')\n"
        "while True:\n    pass"
    )
    look = "import os\n[p for p in ('/tmp/left_by_a', '/dev/shm/left_by_a', '/tmp/fifo_by_a') if os.path.lexists(p)]"
    script = {
        "rules": [
            {"match": {"tool": "."}, "emit": [{"final": "Noted."}]},
            python_rule("plant", plant),
            python_rule("look", look),
        ]
    }
    settings = hosted_settings(tmp_path, web, mcp_server.url, max_sandboxes=1, wall_s=1)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        create(client(live), False, input="plant", tools=[PYTHON_TOOL])  # times out: its sandbox is closed
        other = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-b", max_retries=0, timeout=60)
        seen, _ = create(other, False, input="look", tools=[PYTHON_TOOL])
        (call,) = of(seen, "code_interpreter_call")
        assert call.status == "completed" and call.outputs[0].logs.strip() == "[]", call.outputs
    finally:
        live.stop()
        for path in ("/tmp/left_by_a", "/dev/shm/left_by_a", "/tmp/fifo_by_a"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox mounts its private directories and /proc as root")
def test_the_sandbox_sees_its_own_tmp_and_proc_not_the_hosts(tmp_path, web, mcp_server):
    """Its /tmp, /var/tmp and /dev/shm are tmpfs of its own (the host's files out of sight, its own gone with
    it) and its /proc lists its own processes: the gateway's environment and other sandboxes cannot be read."""
    planted = Path("/tmp") / f"host_secret_{os.getpid()}"
    planted.write_text("host only")
    look = (
        "import os\n"
        "open('/tmp/from_sandbox', 'w').write('x')\n"
        "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        f"dict(host_file=os.path.exists({str(planted)!r}), gateway=os.path.exists('/proc/{os.getpid()}'),\n"
        "     most_pids=max(pids), tmp=sorted(os.listdir('/tmp')), shm=os.listdir('/dev/shm'), full=full())"
    )
    fill = (  # /dev/shm is capped at file_mb (1 MiB here) in all, though each file stays under the file limit
        "def full():\n"
        "    try:\n"
        "        for n in range(3):\n"
        "            open(f'/dev/shm/part{n}', 'wb').write(b'x' * 700_000)\n"
        "    except OSError as error:\n"
        "        return error.errno\n"
        "    finally:\n"
        "        for n in range(3):\n"
        "            os.path.exists(f'/dev/shm/part{n}') and os.unlink(f'/dev/shm/part{n}')\n"
    )
    look = look.replace("import os\n", "import os\n" + fill, 1)
    script = {"rules": [{"match": {"tool": "."}, "emit": [{"final": "Noted."}]}, python_rule("look", look)]}
    settings = hosted_settings(tmp_path, web, mcp_server.url, file_mb=1)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        response, _ = create(client(live), False, input="look", tools=[PYTHON_TOOL])
        (call,) = of(response, "code_interpreter_call")
        seen = ast.literal_eval(call.outputs[0].logs.strip())
        assert seen["host_file"] is False and seen["gateway"] is False
        assert seen["most_pids"] < 20  # the namespace's init, its kernel and what cells start
        assert len(seen["tmp"]) == 2 and "from_sandbox" in seen["tmp"]  # its working directory and its file
        assert seen["shm"] == []
        assert seen["full"] == errno.ENOSPC  # the private /dev/shm is a sized tmpfs
        assert not Path("/tmp/from_sandbox").exists()  # nothing it wrote reached the host
    finally:
        live.stop()
        planted.unlink()


@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox has a /proc of its own only when the gateway runs as root")
def test_no_process_a_cell_starts_outlives_the_cell(tmp_path, web, mcp_server):
    """A detached child (its own session, re-forking) is gone once its cell has returned."""
    detach = (
        "import subprocess, sys\n"
        "spin = 'import os, time\\nwhile True:\\n    os.getpid() % 7 or os.fork()\\n    time.sleep(0.2)'\n"
        "subprocess.Popen([sys.executable, '-c', spin], start_new_session=True).pid > 0"
    )
    look = "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())"
    script = {
        "rules": [
            {"match": {"tool": "True"}, "emit": [{"raw": PYTHON_CALL.format(code=look)}]},
            {"match": {"tool": "."}, "emit": [{"final": "Noted."}]},
            python_rule("detach", detach),
        ]
    }
    settings = hosted_settings(tmp_path, web, mcp_server.url)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        response, _ = create(client(live), False, input="detach", tools=[PYTHON_TOOL])
        started, listed = of(response, "code_interpreter_call")
        assert started.outputs[0].logs.strip() == "True"
        assert ast.literal_eval(listed.outputs[0].logs.strip()) == [1, 2]  # init and the kernel alone
    finally:
        live.stop()
