"""Per-sandbox control groups: one memory bound for all of a sandbox's processes (its tmpfs files included), a
process count, a CPU share, and its CPU time read back. cgroup v2 where the gateway may create groups under its
own, else the v1 memory, pids, cpu and cpuacct hierarchies; none when neither is writable (the sandbox then
has per-process limits only, and says so)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "gpt-oss-sandboxes"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpu")
PERIOD_US = 100_000
EMPTY_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    memory_bytes: int
    processes: int
    cpus: float


def _own_paths(cgroup_file: Path) -> dict[str, str]:
    """This process's cgroup per v1 controller, and per v2 under the key ''."""
    paths: dict[str, str] = {}
    for line in cgroup_file.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable(parent: Path) -> Path:
    parent.mkdir(exist_ok=True)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{parent} is not this gateway's to write")
    return parent


class CgroupTree:
    """Where this replica's sandboxes get their groups: `<its own cgroup>/gpt-oss-sandboxes/<name>`."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version = version
        self._parents = parents  # per controller (v2: one, under '')

    @classmethod
    def detect(cls, root: Path = ROOT, cgroup_file: Path = Path("/proc/self/cgroup")) -> CgroupTree | None:
        try:
            paths = _own_paths(cgroup_file)
        except OSError:
            return None
        for attempt in (cls._v2, cls._v1):
            with contextlib.suppress(OSError):
                tree = attempt(root, paths)
                if tree is not None:
                    return tree
        return None

    @classmethod
    def _v2(cls, root: Path, paths: dict[str, str]) -> CgroupTree | None:
        own = root / paths.get("", "/").lstrip("/")
        if "" not in paths or not set(V2_CONTROLLERS) <= set((root / "cgroup.controllers").read_text().split()):
            return None
        parent = _writable(own / PARENT)
        enable = " ".join(f"+{name}" for name in V2_CONTROLLERS)
        try:
            (own / "cgroup.subtree_control").write_text(enable)
        except OSError:  # its own group holds processes (no internal processes in v2): move them to a leaf first
            leaf = own / "gateway"
            leaf.mkdir(exist_ok=True)
            for pid in (own / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    (leaf / "cgroup.procs").write_text(pid)
            (own / "cgroup.subtree_control").write_text(enable)
        (parent / "cgroup.subtree_control").write_text(enable)
        return cls(2, {"": parent})

    @classmethod
    def _v1(cls, root: Path, paths: dict[str, str]) -> CgroupTree | None:
        parents: dict[str, Path] = {}
        for controller in V1_CONTROLLERS:
            mount = root / controller
            if controller not in paths or not (mount / "cgroup.procs").exists():
                return None
            parents[controller] = _writable(mount / paths[controller].lstrip("/") / PARENT)
        return cls(1, parents)

    def names(self) -> list[str]:
        """The sandbox groups present (a crashed replica's leftovers among them)."""
        first = next(iter(self._parents.values()))
        return sorted(entry.name for entry in first.iterdir() if entry.is_dir())

    def create(self, name: str, limits: CgroupLimits) -> Cgroup:
        group = Cgroup(self.version, {controller: parent / name for controller, parent in self._parents.items()})
        group.remove()  # a leftover of the same name (a crash) goes first
        for path in group.paths.values():
            path.mkdir()
        try:
            group.limit(limits)
        except OSError:
            group.remove()
            raise
        return group

    def open(self, name: str) -> Cgroup:
        return Cgroup(self.version, {controller: parent / name for controller, parent in self._parents.items()})


class Cgroup:
    def __init__(self, version: int, paths: dict[str, Path]) -> None:
        self.version = version
        self.paths = paths

    def _file(self, controller: str, name: str) -> Path:
        return self.paths["" if self.version == 2 else controller] / name

    def limit(self, limits: CgroupLimits) -> None:
        quota = max(1000, int(limits.cpus * PERIOD_US))
        if self.version == 2:
            self._file("memory", "memory.max").write_text(str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to bound
                self._file("memory", "memory.swap.max").write_text("0")
            self._file("pids", "pids.max").write_text(str(limits.processes))
            self._file("cpu", "cpu.max").write_text(f"{quota} {PERIOD_US}")
            return
        self._file("memory", "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        with contextlib.suppress(OSError):
            self._file("memory", "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        self._file("pids", "pids.max").write_text(str(limits.processes))
        self._file("cpu", "cpu.cfs_period_us").write_text(str(PERIOD_US))
        self._file("cpu", "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        for path in self.paths.values():
            (path / "cgroup.procs").write_text(str(pid))

    def cpu_seconds(self) -> float:
        if self.version == 2:
            for line in self._file("cpu", "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int(self._file("cpuacct", "cpuacct.usage").read_text()) / 1e9

    def memory_bytes(self) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int(self._file("memory", name).read_text())

    def _pids(self) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(pid) for pid in self._file("pids", "cgroup.procs").read_text().split()]
        return []

    def kill(self) -> None:
        """SIGKILL every process in the group, until none is left (bounded)."""
        deadline = time.monotonic() + EMPTY_WAIT_S
        while (pids := self._pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill()
        for path in self.paths.values():
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
