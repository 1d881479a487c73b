"""The local Python sandbox behind Harmony's `python` tool: a confined worker process per container, kept
across the cells of one response chain and dropped after an idle time.

Each cell runs under a wall-clock limit; past it, every process of the sandbox is killed and the next cell
starts afresh (the model is told its state was reset). When the gateway runs as root each sandbox gets a
uid of its own (`uid_base` + slot), so its process limit counts its own processes alone and a kill reaches
every process it forked. See docs/hosted-tools.md for what this does and does not protect against.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field

log = structlog.get_logger("gateway.sandbox")

WORKER = Path(__file__).with_name("sandbox_worker.py")
START_TIMEOUT_S = 10.0
SUPERVISOR_GRACE_S = 2.0
MAX_FRAME = 1 << 16
KILL = shutil.which("kill") or "/bin/kill"
BUSY = "[python is busy: every sandbox of this gateway is running a cell; try again in a moment]"


class SandboxSettings(BaseModel):
    """Off unless the operator enables it."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    wall_s: float = Field(default=30.0, gt=0, le=600)  # one cell
    cpu_s: int = Field(default=60, gt=0)  # the sandbox's whole life
    memory_mb: int = Field(default=512, ge=64)  # address space
    processes: int = Field(default=16, ge=1)
    file_mb: int = Field(default=64, ge=1)  # any one file it writes, its output included
    output_bytes: int = Field(default=16384, ge=256)  # of a cell's output, shown to the model
    idle_s: float = Field(default=600.0, gt=0)
    max_sandboxes: int = Field(default=16, ge=1)  # per replica; the least recently used goes first
    uid_base: int = Field(default=61000, ge=1000)  # as root: slot n runs as uid_base + n
    python: str = sys.executable  # the interpreter cells run on (its site-packages are not loaded: -I -S)


@dataclass(slots=True)
class CellResult:
    output: str
    failed: bool  # the cell raised, timed out, or the sandbox died
    reset: bool = False  # the sandbox's state is gone (timeout or death)


class SandboxDied(Exception):
    pass


class SandboxUnavailable(Exception):
    """The sandbox cannot start here; the message says why (for the operator)."""


class Sandbox:
    def __init__(self, tenant: str, settings: SandboxSettings, slot: int) -> None:
        self.tenant = tenant
        self.slot = slot
        self.last_used = time.monotonic()
        self.network_isolated = False
        self.pid_namespace = False
        self.mount_namespace = False
        self._settings = settings
        self._uid = settings.uid_base + slot if os.getuid() == 0 else None
        self._dir = tempfile.mkdtemp(prefix="gpt-oss-sandbox-")
        self._capture = _capture_file()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        settings = self._settings
        if self._uid is not None:
            os.chown(self._dir, self._uid, self._uid)
        os.chmod(self._dir, 0o700)
        parent_end, child_end = socket.socketpair()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self._dir, "TMPDIR": self._dir, "LANG": "C.UTF-8"}
        try:
            self._process = await asyncio.create_subprocess_exec(
                settings.python,
                "-I",
                "-S",
                str(WORKER),
                str(child_end.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=self._capture,
                stderr=self._capture,
                pass_fds=(child_end.fileno(),),
                start_new_session=True,
                cwd=self._dir,
                env=env,
            )
        finally:
            child_end.close()
        self._reader, self._writer = await asyncio.open_connection(sock=parent_end)
        limits = {
            "memory_bytes": settings.memory_mb << 20,
            "cpu_s": settings.cpu_s,
            "processes": settings.processes,
            "file_bytes": settings.file_mb << 20,
            "workdir": self._dir,
            "uid": self._uid,
            "tmp_bytes": settings.file_mb << 20,  # each private /tmp, /var/tmp, /dev/shm (root: a tmpfs of its own)
        }
        self._send(orjson.dumps(limits))
        hello = await asyncio.wait_for(self._receive(), START_TIMEOUT_S)
        if not hello.get("stdlib_readable"):
            raise SandboxUnavailable(
                f"the sandbox's interpreter ({settings.python}) has a standard library its uid cannot read; "
                "set hosted_tools.python.python to an interpreter installed readable by all users"
            )
        self.network_isolated = bool(hello.get("network_isolated"))
        self.pid_namespace = bool(hello.get("pid_namespace"))
        self.mount_namespace = bool(hello.get("mount_namespace"))

    def _send(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(struct.pack(">I", len(data)) + data)

    async def _receive(self) -> dict[str, object]:
        assert self._reader is not None
        try:
            size = struct.unpack(">I", await self._reader.readexactly(4))[0]
            if size > MAX_FRAME:
                raise SandboxDied
            payload = orjson.loads(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError, orjson.JSONDecodeError) as exc:
            raise SandboxDied from exc
        if not isinstance(payload, dict):
            raise SandboxDied
        return payload

    async def run(self, code: str) -> CellResult:
        """Run one cell; a timeout or a death kills the sandbox (the caller drops it)."""
        async with self._lock:
            self.last_used = time.monotonic()
            wall_s = self._settings.wall_s
            try:
                self._send(code.encode("utf-8", "replace"))
                result = await asyncio.wait_for(self._receive(), wall_s)
            except TimeoutError:
                output = self._output() + f"\n[timed out after {wall_s:g} s; the sandbox was reset: its state is gone]"
                await self.close()
                return CellResult(output, failed=True, reset=True)
            except asyncio.CancelledError:  # the response was cancelled mid-cell: the cell must not run on
                await self.close()
                raise
            except (SandboxDied, ConnectionError):
                output = (
                    self._output() + "\n[the sandbox process ended (a resource limit or a crash); its state is gone]"
                )
                await self.close()
                return CellResult(output, failed=True, reset=True)
            return CellResult(self._output(), failed=bool(result.get("error")))

    def _output(self) -> str:
        limit = self._settings.output_bytes
        data = os.pread(self._capture, limit + 1, 0)
        text = data[:limit].decode("utf-8", "replace")
        if len(data) > limit:
            text += f"\n[output truncated at {limit} bytes]"
        return text

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    @property
    def alive(self) -> bool:
        return not self._closed and self._process is not None and self._process.returncode is None

    async def close(self) -> None:
        """Kill every process of the sandbox and remove its directory (once)."""
        if self._closed:
            return
        self._closed = True
        process = self._process
        if process is not None:
            if self.pid_namespace:  # the supervisor kills the namespace's init, and the kernel empties it
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), SUPERVISOR_GRACE_S)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, 9)
            if self._uid is not None:
                await _kill_uid(self._uid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._writer is not None:
            self._writer.close()
        os.close(self._capture)
        await asyncio.to_thread(shutil.rmtree, self._dir, True)


def _capture_file() -> int:
    """An unnamed append-mode file for a sandbox's output: the parent's alone, no path in the sandbox."""
    fd, path = tempfile.mkstemp(prefix="gpt-oss-sandbox-out-")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


async def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`, however it forked or re-grouped: kill(-1) as that uid."""
    killer = await asyncio.create_subprocess_exec(KILL, "-9", "-1", user=uid, group=uid, extra_groups=[])
    await killer.wait()


class SandboxPool:
    """Sandboxes by container id, for their tenant alone; reaped when idle. When full, the least recently used
    idle sandbox makes room; while every one runs a cell, a new container's cell is refused as busy."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._sandboxes: dict[str, Sandbox] = {}
        self._opening = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None

    async def run(self, tenant: str, container_id: str, code: str) -> CellResult:
        async with self._opening:  # one sandbox per container, however many cells arrive at once
            sandbox = self._sandboxes.get(container_id)
            if sandbox is not None and sandbox.tenant != tenant:
                return CellResult(f"[container {container_id} is not available]", failed=True)
            if sandbox is not None and not sandbox.alive:
                await self._drop(container_id)
                sandbox = None
            if sandbox is None:
                if not self._room():
                    return CellResult(BUSY, failed=True)
                sandbox = await self._open(tenant, container_id)
        result = await sandbox.run(code)
        if result.reset:
            self._sandboxes.pop(container_id, None)
        return result

    def _room(self) -> bool:
        """Whether a new sandbox fits: a free place, or an idle sandbox to give up (never a running cell's)."""
        full = len(self._sandboxes) >= self.settings.max_sandboxes
        return not full or any(not sandbox.busy for sandbox in self._sandboxes.values())

    async def _open(self, tenant: str, container_id: str) -> Sandbox:
        if len(self._sandboxes) >= self.settings.max_sandboxes:
            idle = [key for key, sandbox in self._sandboxes.items() if not sandbox.busy]
            await self._drop(min(idle, key=lambda key: self._sandboxes[key].last_used))
        used = {sandbox.slot for sandbox in self._sandboxes.values()}
        slot = next(n for n in range(self.settings.max_sandboxes) if n not in used)
        sandbox = Sandbox(tenant, self.settings, slot)
        self._sandboxes[container_id] = sandbox
        try:
            await sandbox.start()
        except BaseException:
            self._sandboxes.pop(container_id, None)
            await sandbox.close()
            raise
        log.info(
            "sandbox_started",
            slot=slot,
            network_isolated=sandbox.network_isolated,
            pid_namespace=sandbox.pid_namespace,
            mount_namespace=sandbox.mount_namespace,
        )
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())
        return sandbox

    async def _drop(self, container_id: str) -> None:
        sandbox = self._sandboxes.pop(container_id, None)
        if sandbox is not None:
            await sandbox.close()

    async def _reap(self) -> None:
        while self._sandboxes:
            await asyncio.sleep(min(self.settings.idle_s / 4, 30.0))
            now = time.monotonic()
            for container_id, sandbox in list(self._sandboxes.items()):
                if now - sandbox.last_used > self.settings.idle_s and not sandbox.busy:
                    await self._drop(container_id)

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for container_id in list(self._sandboxes):
            await self._drop(container_id)
