"""The local Python sandbox behind Harmony's `python` tool: a confined worker process per container, kept
across the cells of one response chain and dropped after an idle time.

Each sandbox holds a host-unique number (`lease.py`): as root it runs as `uid_base` + that number, and its
cgroup (where the gateway may create them) bounds its memory, processes and CPU together. The worker confines
itself (`worker.py`: namespaces, a private root, seccomp from `seccomp.py`) and says what it got; under
`isolation: strict` a sandbox that got less is refused. Each cell runs under a wall-clock limit; past it, every
process of the sandbox is killed and the next cell starts afresh (the model is told its state was reset). See
docs/hosted-tools.md for the threat model.
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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field

from . import seccomp
from .cgroup import Cgroup, CgroupLimits, CgroupTree
from .lease import Lease, Leases
from .memory_bound import MemoryBound, memory_bound

log = structlog.get_logger("gateway.sandbox")

WORKER = Path(__file__).with_name("worker.py")
START_TIMEOUT_S = 10.0
SUPERVISOR_GRACE_S = 2.0
MAX_FRAME = 1 << 16
KILL = shutil.which("kill") or "/bin/kill"
BUSY = "[python is busy: every sandbox of this gateway is running a cell; try again in a moment]"
SANDBOX_PROCESSES = 3  # the worker (the supervisor), the namespace's init and the kernel


class SandboxSettings(BaseModel):
    """Off unless the operator enables it."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    isolation: Literal["strict", "weak"] = "strict"  # weak: run with whatever confinement the host allows
    wall_s: float = Field(default=30.0, gt=0, le=600)  # one cell
    cpu_s: int = Field(default=60, gt=0)  # the sandbox's whole life
    cpus: float = Field(default=1.0, gt=0, le=64)  # its CPU share at any moment (with a cgroup)
    memory_mb: int = Field(default=512, ge=64)  # each process's address space; all its processes' memory (cgroup)
    processes: int = Field(default=16, ge=1)
    # without a cgroup per sandbox, memory_mb x processes x max_sandboxes must fit (None: half the container's)
    memory_budget_mb: int | None = Field(default=None, ge=64)
    file_mb: int = Field(default=64, ge=1)  # any one file it writes, its output included; each of its tmpfs
    output_bytes: int = Field(default=16384, ge=256)  # of a cell's output, shown to the model
    idle_s: float = Field(default=600.0, gt=0)
    max_sandboxes: int = Field(default=16, ge=1)  # per replica; the least recently used idle one goes first
    uid_base: int = Field(default=61000, ge=1000)  # as root: the sandbox numbered n runs as uid_base + n
    uid_range: int = Field(default=4096, ge=16, le=1 << 20)  # numbers shared by every replica of the host
    python: str = sys.executable  # the interpreter cells run on (its site-packages are not loaded: -I -S)


@dataclass(slots=True)
class CellResult:
    output: str
    failed: bool  # the cell raised, timed out, or the sandbox died
    reset: bool = False  # the sandbox's state is gone (timeout or death)


@dataclass(slots=True)
class Isolation:
    """What confinement a sandbox got, as its worker reported it (and the cgroup, as the pool made it)."""

    user_namespace: bool = False
    private_root: bool = False
    pid: bool = False
    network: bool = False
    ipc: bool = False
    own_proc: bool = False
    no_new_privs: bool = False
    seccomp: bool = False
    cgroup: bool = False

    REQUIRED = ("private_root", "pid", "network", "ipc", "no_new_privs", "seccomp")  # by isolation: strict

    @classmethod
    def of(cls, hello: dict[str, object], cgroup: bool) -> Isolation:
        names = {field.name for field in fields(cls)}
        return cls(**{key: bool(value) for key, value in hello.items() if key in names}, cgroup=cgroup)

    def missing(self) -> list[str]:
        return [name for name in self.REQUIRED if not getattr(self, name)]

    def as_log(self) -> dict[str, bool]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class SandboxDied(Exception):
    pass


class SandboxUnavailable(Exception):
    """The sandbox cannot start here; the message says why (for the operator)."""


class Sandbox:
    def __init__(
        self, tenant: str, settings: SandboxSettings, lease: Lease, leases: Leases, cgroups: CgroupTree | None
    ) -> None:
        self.tenant = tenant
        self.lease = lease
        self.last_used = time.monotonic()
        self.isolation = Isolation()
        self._settings = settings
        self._uid = settings.uid_base + lease.number if os.getuid() == 0 else None
        self._dir = leases.workdir(lease)  # used only where there is no private root
        self._cgroups = cgroups
        self._cgroup: Cgroup | None = None
        self._capture = _capture_file()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        settings = self._settings
        await asyncio.to_thread(self._prepare)
        parent_end, child_end = socket.socketpair()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
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
                cwd="/",
                env=env,
            )
        finally:
            child_end.close()
        self._reader, self._writer = await asyncio.open_connection(sock=parent_end)
        if self._cgroup is not None:  # before it reads its limits, so all it forks is in the group
            self._cgroup.add(self._process.pid)
        program = seccomp.program()
        limits = {
            "memory_bytes": settings.memory_mb << 20,
            "cpu_s": settings.cpu_s,
            "processes": settings.processes,
            "file_bytes": settings.file_mb << 20,
            "workdir": str(self._dir),
            "uid": self._uid,
            "tmp_bytes": settings.file_mb << 20,  # each of its private /tmp, /var/tmp and /dev/shm
            "seccomp": program.hex() if program is not None else None,
        }
        self._send(orjson.dumps(limits))
        hello = await asyncio.wait_for(self._receive(), START_TIMEOUT_S)
        if not hello.get("ready"):
            raise SandboxUnavailable(f"the sandbox could not confine itself: {hello.get('failed')}")
        self.isolation = Isolation.of(hello, cgroup=self._cgroup is not None)
        missing = self.isolation.missing()
        if missing and settings.isolation == "strict":
            raise SandboxUnavailable(
                f"this host does not allow the sandbox's isolation (missing: {', '.join(missing)}); see "
                "docs/hosted-tools.md, or set hosted_tools.python.isolation to 'weak' to accept less"
            )

    def _prepare(self) -> None:
        """The cgroup and the fallback directory under this sandbox's number, a crashed holder's leftovers gone."""
        shutil.rmtree(self._dir, ignore_errors=True)
        os.mkdir(self._dir, 0o700)
        if self._uid is not None:
            os.chown(self._dir, self._uid, self._uid)
        if self._cgroups is not None:
            limits = CgroupLimits(
                memory_bytes=self._settings.memory_mb << 20,
                processes=self._settings.processes + SANDBOX_PROCESSES,
                cpus=self._settings.cpus,
            )
            self._cgroup = self._cgroups.create(f"sandbox-{self.lease.number}", limits)

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
        """Run one cell; a timeout, a death or a spent CPU budget kills the sandbox (the caller drops it)."""
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
            if self._cgroup is not None and self._cgroup.cpu_seconds() > self._settings.cpu_s:
                output = self._output() + (
                    f"\n[the sandbox used its {self._settings.cpu_s} CPU seconds; it was reset: its state is gone]"
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
        """Kill every process of the sandbox, remove what it had on the host and give its number back (once)."""
        if self._closed:
            return
        self._closed = True
        process = self._process
        if process is not None:
            if self.isolation.pid:  # the supervisor kills the namespace's init, and the kernel empties it
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), SUPERVISOR_GRACE_S)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, 9)
            if self._uid is not None and not self.isolation.pid:  # the uid is this sandbox's alone on the host
                await _kill_uid(self._uid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)
        if self._writer is not None:
            self._writer.close()
        os.close(self._capture)
        await asyncio.to_thread(shutil.rmtree, self._dir, True)
        self.lease.release()


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
        self.unavailable: str | None = None  # why python is not offered (the start-up probe failed)
        self.isolation: Isolation | None = None  # what the start-up probe's sandbox got
        self.memory: MemoryBound | None = None  # what bounds the sandboxes' memory, as the probe found
        self._leases = Leases(settings.uid_range)
        self._cgroups: CgroupTree | None = None
        self._prepared = False
        self._sandboxes: dict[str, Sandbox] = {}
        self._opening = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None

    async def probe(self) -> None:
        """At start: open one sandbox and run a cell, to learn (and log) what isolation this host gives; when it
        cannot start, or gets less than `isolation` asks, python is not offered and the reason is logged."""
        try:
            result = await self.run("-", "cntr_probe", "1 + 1")
            probe = self._sandboxes.get("cntr_probe")
            if result.output.strip() != "2" or probe is None:
                raise SandboxUnavailable(f"the probe's cell failed: {result.output[-200:]}")
            self.isolation = probe.isolation
        except (SandboxUnavailable, OSError) as exc:
            self.unavailable = str(exc)
            log.error("python_not_offered", reason=self.unavailable)
            return
        finally:
            await self._drop("cntr_probe")
        missing = self.isolation.missing()
        log.info("sandbox_isolation", mode=self.settings.isolation, missing=missing, **self.isolation.as_log())
        if missing:
            log.warning("sandbox_isolation_weak", missing=missing)
        settings = self.settings
        self.memory = await asyncio.to_thread(
            memory_bound,
            self.isolation.cgroup,
            settings.memory_mb,
            settings.processes,
            settings.max_sandboxes,
            settings.memory_budget_mb,
        )
        log.info("sandbox_memory_bound", **self.memory.as_log())
        if not self.memory.fits and settings.isolation == "strict":
            self.unavailable = self.memory.refusal()
            log.error("python_not_offered", reason=self.unavailable)
        elif not self.memory.fits:
            log.warning("sandbox_memory_unbounded", reason=self.memory.refusal())

    async def _prepare(self) -> None:
        """Once: the lease directory, the cgroup tree, and what crashed replicas left under free numbers."""
        if self._prepared:
            return
        await asyncio.to_thread(self._leases.prepare)
        self._cgroups = await asyncio.to_thread(CgroupTree.detect)
        await asyncio.to_thread(self._reclaim)
        self._prepared = True

    def _reclaim(self) -> None:
        leftovers = {int(entry.name) for entry in self._leases.directory.iterdir() if entry.name.isdigit()}
        if self._cgroups is not None:
            names = self._cgroups.names()
            leftovers |= {int(name.split("-")[1]) for name in names if name.removeprefix("sandbox-").isdigit()}
        for number in sorted(leftovers):
            lease = self._leases.acquire(number) if number < self.settings.uid_range else None
            if lease is None:
                continue  # a live sandbox's (of this replica or another)
            shutil.rmtree(self._leases.workdir(lease), ignore_errors=True)
            if self._cgroups is not None:
                self._cgroups.open(f"sandbox-{number}").remove()
            lease.release()
            log.info("sandbox_leftovers_reclaimed", number=number)

    async def run(self, tenant: str, container_id: str, code: str) -> CellResult:
        async with self._opening:  # one sandbox per container, however many cells arrive at once
            await self._prepare()
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
                if sandbox is None:
                    return CellResult(BUSY, failed=True)
        result = await sandbox.run(code)
        if result.reset:
            self._sandboxes.pop(container_id, None)
        return result

    def _room(self) -> bool:
        """Whether a new sandbox fits: a free place, or an idle sandbox to give up (never a running cell's)."""
        full = len(self._sandboxes) >= self.settings.max_sandboxes
        return not full or any(not sandbox.busy for sandbox in self._sandboxes.values())

    async def _open(self, tenant: str, container_id: str) -> Sandbox | None:
        if len(self._sandboxes) >= self.settings.max_sandboxes:
            idle = [key for key, sandbox in self._sandboxes.items() if not sandbox.busy]
            await self._drop(min(idle, key=lambda key: self._sandboxes[key].last_used))
        lease = await asyncio.to_thread(self._leases.acquire)
        if lease is None:  # every number of the host is held (by the replicas together)
            return None
        sandbox = Sandbox(tenant, self.settings, lease, self._leases, self._cgroups)
        self._sandboxes[container_id] = sandbox
        try:
            await sandbox.start()
        except BaseException:
            self._sandboxes.pop(container_id, None)
            await sandbox.close()
            raise
        log.info("sandbox_started", number=lease.number, **sandbox.isolation.as_log())
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
