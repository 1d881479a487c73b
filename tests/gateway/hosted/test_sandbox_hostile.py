"""The python sandbox against a hostile tenant, through the public API: each attack is a cell the (scripted)
model runs through `code_interpreter`, and each must fail the way the isolation says — the gateway's process and
files out of sight, no namespaces, mounts, tracing or kernel surface past the seccomp allow-list, nothing shared
between tenants (files, SysV IPC, abstract sockets), limits per sandbox (memory, processes, CPU), numbers and
uids unique across replicas, leftovers of a crash reclaimed — as root and as an unprivileged gateway, which
gets the same isolation through a user namespace or, where the host forbids one, does not offer python."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import openai
import pytest
from gateway_fixtures import write_script
from hosted_gateway import MODEL, PYTHON_TOOL, client, create, hosted_settings, of, python_rule
from live_gateway import GatewayProcess, LiveGateway
from unprivileged import SYSTEM_PYTHON, unprivileged_gateway, write_readable

from gateway.hosted.sandbox import SandboxSettings

PRELUDE = """\
import ctypes, errno, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(function, *arguments):
    ctypes.set_errno(0)
    result = function(*arguments)
    return result, errno.errorcode.get(ctypes.get_errno())
"""
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
X86_64_REFUSED = {  # system calls outside the allow-list, by their x86-64 numbers
    "keyctl": 250,
    "add_key": 248,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "kexec_load": 246,
    "init_module": 175,
    "personality": 135,
    "chroot": 161,
    "pivot_root": 155,
    "mknod": 133,
    "setuid": 105,
    "process_vm_readv": 310,
    "setns": 308,
}
HOST_SOCKET = Path(tempfile.gettempdir()) / f"gw-hostile-{os.getpid()}.sock"

ATTACKS = {
    "attack-gateway-process": "def signal(pid):\n"
    "    try:\n        os.kill(pid, 0)\n        return 'reached'\n"
    "    except ProcessLookupError:\n        return 'no such process'\n"
    "(os.path.exists('/proc/{gateway}/environ'), signal({gateway}), [k for k in os.environ if 'GATEWAY' in k])",
    "attack-host-files": "(os.path.exists({this_file!r}), os.path.exists('/etc/shadow'), "
    "os.path.exists('/home'), sorted(os.listdir('/etc')), os.listdir('/tmp'))",
    "attack-namespaces": "[call(libc.unshare, flag) for flag in ({user}, {mount}, {net}, {pid})]",
    "attack-mount": "[call(libc.mount, b'none', b'/tmp', b'tmpfs', 0, None), call(libc.umount2, b'/proc', 2)]",
    "attack-ptrace": "call(libc.ptrace, 16, 1, 0, 0)",
    "attack-kernel-surface": "{{name: call(libc.syscall, number, 0, 0, 0, 0, 0)[1]\n"
    " for name, number in {numbers}.items()}}",
    "attack-clone-namespace": "call(libc.syscall, 56, {user} | {net} | signal.SIGCHLD, 0, 0, 0, 0)",
    "attack-sockets": "def family(number):\n"
    "    try:\n        socket.socket(number, socket.SOCK_RAW if number != 1 else socket.SOCK_STREAM).close()\n"
    "        return 'opened'\n"
    "    except OSError as error:\n        return errno.errorcode[error.errno]\n"
    "[family(number) for number in (16, 17, 40, 1)]",
    "attack-privileges": "lines = open('/proc/self/status').read().splitlines()\n"
    "status = dict(line.split(':\\t', 1) for line in lines)\n"
    "(status['NoNewPrivs'], status['CapEff'], status['Seccomp'], os.system('su -c true 2>/dev/null') != 0)",
    "attack-host-socket": "def reach(path):\n"
    "    try:\n        socket.socket(socket.AF_UNIX).connect(path)\n        return 'connected'\n"
    "    except OSError as error:\n        return errno.errorcode[error.errno]\n"
    "reach({host_socket!r})",
    "attack-sysv-plant": "call(libc.shmget, 0x5EED, 4096, 0o1000 | 0o666)[0] >= 0",
    "attack-sysv-look": "call(libc.shmget, 0x5EED, 0, 0)",
    "attack-abstract-plant": "held = socket.socket(socket.AF_UNIX)\nheld.bind('\\0gw-hostile')\nheld.listen()\nTrue",
    "attack-abstract-look": "def reach():\n"
    "    try:\n        socket.socket(socket.AF_UNIX).connect('\\0gw-hostile')\n        return 'connected'\n"
    "    except OSError as error:\n        return errno.errorcode[error.errno]\n"
    "reach()",
    "attack-memory-across-processes": "children = []\n"
    "for _ in range(3):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        block = b'x' * (150 << 20)\n        import time; time.sleep(1.5)\n        os._exit(0)\n"
    "    children.append(pid)\n"
    "sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children)",
    "attack-processes": "import time\ncount = 0\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
    "        count += 1\n"
    "except OSError:\n    pass\n"
    "count",
}


def _attack_script() -> dict:
    values = {
        "gateway": os.getpid(),
        "this_file": str(Path(__file__).resolve()),
        "user": CLONE_NEWUSER,
        "mount": CLONE_NEWNS,
        "net": CLONE_NEWNET,
        "pid": CLONE_NEWPID,
        "numbers": X86_64_REFUSED,
        "host_socket": str(HOST_SOCKET),
    }
    rules: list[dict] = [{"match": {"tool": "."}, "emit": [{"final": "Noted."}]}]
    for name, code in ATTACKS.items():
        rules.append(python_rule(f"^{name}$", PRELUDE + code.format(**values)))
    return {"rules": rules}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, web, mcp_server):
    tmp_path = tmp_path_factory.mktemp("hostile")
    settings = hosted_settings(tmp_path, web, mcp_server.url, wall_s=5, max_sandboxes=4)
    settings = settings.model_copy(update={"mock_script": str(write_script(tmp_path, _attack_script()))})
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(HOST_SOCKET))
    os.chmod(HOST_SOCKET, 0o777)
    listener.listen()
    live = LiveGateway(settings).start()
    yield live
    live.stop()
    listener.close()
    HOST_SOCKET.unlink()


def _run(live, attack: str, tenant: str = "sk-tenant-a") -> object:
    api = openai.OpenAI(base_url=live.url + "/v1", api_key=tenant, max_retries=0, timeout=60)
    response, _ = create(api, False, input=attack, tools=[PYTHON_TOOL])
    (call,) = of(response, "code_interpreter_call")
    logs = call.outputs[0].logs.strip()
    try:
        return ast.literal_eval(logs)
    except (ValueError, SyntaxError):
        return logs


def test_the_gateways_process_and_environment_are_out_of_reach(hostile):
    assert _run(hostile, "attack-gateway-process") == (False, "no such process", [])


def test_the_hosts_files_are_out_of_sight(hostile):
    this_file, shadow, home, etc, tmp = _run(hostile, "attack-host-files")
    assert (this_file, shadow, home) == (False, False, False)
    assert set(etc) <= {"passwd", "group", "nsswitch.conf", "ld.so.cache", "localtime", "mime.types"}
    assert tmp == ["work"]  # its own tmpfs: its working directory alone


def test_no_new_namespace_mount_or_trace(hostile):
    assert _run(hostile, "attack-namespaces") == [(-1, "EPERM")] * 4
    assert _run(hostile, "attack-mount") == [(-1, "EPERM")] * 2
    assert _run(hostile, "attack-ptrace") == (-1, "EPERM")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack names system calls by their x86-64 numbers")
def test_the_kernel_surface_past_the_allow_list_is_refused(hostile):
    assert _run(hostile, "attack-kernel-surface") == dict.fromkeys(X86_64_REFUSED, "EPERM")
    assert _run(hostile, "attack-clone-namespace") == (-1, "EPERM")


def test_only_unix_and_ip_sockets_and_no_host_socket(hostile):
    assert _run(hostile, "attack-sockets") == ["EPERM", "EPERM", "EPERM", "opened"]  # netlink, packet, vsock, unix
    assert _run(hostile, "attack-host-socket") == "ENOENT"  # a 0777 socket in the host's /tmp


def test_no_privilege_to_gain(hostile):
    no_new_privs, capabilities, seccomp_mode, su_failed = _run(hostile, "attack-privileges")
    assert (no_new_privs, int(capabilities, 16), seccomp_mode, su_failed) == ("1", 0, "2", True)


def test_tenants_share_no_sysv_ipc_or_abstract_socket(hostile):
    """Tenant A's sandbox holds a SysV segment and listens on an abstract socket; tenant B, at the same time,
    finds neither."""
    assert _run(hostile, "attack-sysv-plant") is True
    assert _run(hostile, "attack-abstract-plant") is True
    assert _run(hostile, "attack-sysv-look", tenant="sk-tenant-b") == (-1, "ENOENT")
    assert _run(hostile, "attack-abstract-look", tenant="sk-tenant-b") == "ECONNREFUSED"


def test_the_process_limit_holds_for_the_whole_sandbox(hostile):
    processes = hostile.settings.hosted_tools.python.processes
    count = _run(hostile, "attack-processes")
    assert isinstance(count, int) and count <= processes


@pytest.mark.skipif(os.getuid() != 0, reason="the gateway makes cgroups as root here")
def test_memory_is_bounded_for_all_of_a_sandboxs_processes(hostile):
    """Three processes of 150 MiB each, each under the 256 MiB address-space limit: together past the
    sandbox's 256 MiB, so the cgroup kills at least one (it ran before, per-process limits only)."""
    seen = _run(hostile, "attack-memory-across-processes")
    assert (isinstance(seen, list) and -9 in seen) or "the sandbox process ended" in str(seen), seen


@pytest.mark.skipif(os.getuid() != 0, reason="the gateway makes cgroups as root here")
def test_the_cpu_budget_holds_for_the_whole_sandbox(tmp_path, web, mcp_server):
    """Two children burn 1.3 CPU seconds each, each under the 2 s per-process limit; the sandbox's 2 s are
    spent together, so it is reset when the cell returns."""
    burn = (
        "import os, time\n"
        "def spin():\n    end = time.process_time() + 1.3\n    while time.process_time() < end:\n        pass\n"
        "children = [pid for pid in (os.fork() for _ in range(2)) if pid or (spin(), os._exit(0))]\n"
        "[os.waitpid(pid, 0) for pid in children] and 'burnt'"
    )
    script = {"rules": [{"match": {"tool": "."}, "emit": [{"final": "Noted."}]}, python_rule("burn", burn)]}
    settings = hosted_settings(tmp_path, web, mcp_server.url, cpu_s=2, wall_s=10)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        response, _ = create(client(live), False, input="burn", tools=[PYTHON_TOOL])
        (call,) = of(response, "code_interpreter_call")
        assert "'burnt'" in call.outputs[0].logs
        assert "used its 2 CPU seconds" in call.outputs[0].logs and call.status == "failed"
    finally:
        live.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="sandboxes get uids of their own only when the gateway runs as root")
def test_replicas_on_one_host_never_share_a_sandbox_number_or_uid(tmp_path):
    """Two replicas' pools on one host, each with 8 sandboxes open: 16 different uids; one replica's timeout
    leaves the other's running cell alone."""
    replicas = [_PoolProcess(tmp_path / "replica0", wall_s=3.0), _PoolProcess(tmp_path / "replica1", wall_s=0.5)]
    try:
        uids = [uid for replica in replicas for uid in replica.ask("open 8")]
        assert len(set(uids)) == 16
        replicas[0].send("sleep")  # a cell of 2 s in replica 0's first sandbox
        assert "timed out" in replicas[1].ask("timeout")  # replica 1 kills a sandbox of its own
        assert replicas[0].ask("result") == "slept"
    finally:
        for replica in replicas:
            replica.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="the gateway makes cgroups as root here")
def test_a_crashed_replicas_leftovers_are_reclaimed_at_start(tmp_path):
    crashed = _PoolProcess(tmp_path / "crashed")
    (uid,) = crashed.ask("open 1")
    crashed.kill()  # no cleanup: its lease directory and cgroup stay behind
    number = uid - SandboxSettings().uid_base
    leases = Path(tempfile.gettempdir()) / "gpt-oss-sandboxes-0"
    cgroups = list(Path("/sys/fs/cgroup").glob(f"*/**/gpt-oss-sandboxes/sandbox-{number}"))
    assert (leases / str(number)).exists() and cgroups
    fresh = _PoolProcess(tmp_path / "fresh")
    try:
        fresh.ask("probe")
        assert not (leases / str(number)).exists()
        assert not [path for path in cgroups if path.exists()]
    finally:
        fresh.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="the pool driver's sandboxes get uids of their own as root")
def test_an_interpreter_installed_under_tmp_runs_cells(tmp_path):
    """A virtual environment under /tmp, which both the tmpfs the sandbox's root is built on and the sandbox's
    own /tmp would shadow (a checkout under /tmp failed every cell before): its cells run, confined."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert str(venv).startswith("/tmp/")
    replica = _PoolProcess(tmp_path / "replica", python=str(venv / "bin" / "python"))
    try:
        (uid,) = replica.ask("open 1")
        assert uid != 0
    finally:
        replica.stop()


POOL_DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys
    from gateway.hosted.sandbox import SandboxPool, SandboxSettings

    async def main():
        settings = SandboxSettings(enabled=True, wall_s=float(sys.argv[2]), max_sandboxes=8, python=sys.argv[1])
        pool = SandboxPool(settings)
        pending = None
        for line in sys.stdin:
            command = line.split()
            if command[0] == "open":
                cells = [pool.run("t", f"c{n}", "import os; os.getuid()") for n in range(int(command[1]))]
                answer = [int(cell.output) for cell in await asyncio.gather(*cells)]
            elif command[0] == "sleep":
                pending = asyncio.ensure_future(pool.run("t", "c0", "import time; time.sleep(2); 'slept'"))
                continue
            elif command[0] == "timeout":
                answer = (await pool.run("t", "c1", "while True: pass")).output
            elif command[0] == "result":
                answer = (await pending).output.strip().strip("'")
            elif command[0] == "probe":
                await pool.probe()
                answer = pool.unavailable
            print("ANSWER", json.dumps(answer), flush=True)
        await pool.aclose()

    asyncio.run(main())
    """
)


class _PoolProcess:
    """A replica's sandbox pool in a process of its own, driven line by line."""

    def __init__(self, directory: Path, wall_s: float = 3.0, python: str = sys.executable) -> None:
        directory.mkdir()
        driver = directory / "driver.py"
        driver.write_text(POOL_DRIVER)
        self.process = subprocess.Popen(
            [sys.executable, str(driver), python, str(wall_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def ask(self, line: str):
        self.send(line)
        assert self.process.stdout is not None
        for line in self.process.stdout:  # its log lines go there too
            if line.startswith("ANSWER "):
                return json.loads(line.removeprefix("ANSWER "))
        raise AssertionError("the pool's process ended")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        time.sleep(0.3)  # its workers see their channel close and end

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


# ---- an unprivileged gateway: uid 10001 as the image runs it, with and without user namespaces ----


def _unprivileged_gateway(directory: Path, isolation: str, no_user_namespaces: bool = False) -> GatewayProcess:
    directory.mkdir(mode=0o755)
    script = {"rules": [{"match": {"tool": "."}, "emit": [{"final": "Noted."}]}, python_rule("who", WHO)]}
    python = {"enabled": True, "wall_s": 5, "python": SYSTEM_PYTHON, "isolation": isolation, **FITS_WITHOUT_CGROUP}
    hosted = {"python": python}
    env = {
        "GATEWAY_MOCK_SCRIPT": str(write_readable(directory / "script.json", script)),
        "GATEWAY_HOSTED_TOOLS": json.dumps(hosted),
    }
    return unprivileged_gateway(directory, env, no_user_namespaces).start()


# no cgroup for an unprivileged gateway here: memory_mb x processes x max_sandboxes (1 GiB) within the budget
FITS_WITHOUT_CGROUP = {"memory_mb": 128, "processes": 4, "max_sandboxes": 2, "memory_budget_mb": 1024}
WHO = (
    "import os\n"
    "status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines())\n"
    "(os.getuid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.path.exists('/work'),"
    " status['Seccomp'], int(status['CapEff'], 16))"
)


def _who(gateway: GatewayProcess) -> tuple[object, dict[str, str]]:
    """What the sandbox says of itself (None when python was not offered), and the response's headers."""
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    raw = api.responses.with_raw_response.create(model=MODEL, input="who", tools=[PYTHON_TOOL])
    calls = of(raw.parse(), "code_interpreter_call")
    logs = calls[0].outputs[0].logs.strip() if calls and calls[0].outputs else None
    return (ast.literal_eval(logs) if logs else None), dict(raw.headers)


def test_an_unprivileged_gateway_isolates_python_through_a_user_namespace(shared_dir):
    gateway = _unprivileged_gateway(shared_dir / "gw", "strict")
    try:
        seen, _ = _who(gateway)
        uid, processes, host_dir_seen, seccomp_mode, capabilities = seen
        assert uid == 1000 and processes[:2] == [1, 2] and not host_dir_seen
        assert seccomp_mode == "2" and capabilities == 0
    finally:
        gateway.stop()
    assert '"user_namespace":true' in (shared_dir / "gw" / "gateway.log").read_text()


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap makes a host without user namespaces here")
@pytest.mark.parametrize("isolation", ["strict", "weak"])
def test_without_user_namespaces_python_is_offered_only_when_the_operator_accepts_less(shared_dir, isolation):
    gateway = _unprivileged_gateway(shared_dir / "gw", isolation, no_user_namespaces=True)
    try:
        seen, headers = _who(gateway)
    finally:
        gateway.stop()
    log = (shared_dir / "gw" / "gateway.log").read_text()
    if isolation == "strict":
        assert seen is None and headers["x-gateway-tools-not-offered"] == "code_interpreter"
        assert "python_not_offered" in log and "missing: private_root, pid, network, ipc" in log
    else:
        assert seen is not None and seen[0] == 10001  # it ran, unconfined but for its limits, and said so
        assert "sandbox_isolation_weak" in log
