"""A CPU quota per process, so that servers sharing one machine each run as on a machine of its own.

Three model servers on two cores share them: where one idles, the others take its time, so routing that leaves a
server idle looks faster than it would on a fleet whose servers each have their own machine. Each server confined
to its own cgroup with a fixed share (`cpu.max` in cgroup v2, CFS quota in the v1 `cpu` hierarchy) gets that share
whatever the others do. Where no cgroup is writable (no root, a read-only hierarchy), nothing is confined, and
`confined` says whether every process asked for was.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PERIOD_US = 100_000
V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpu")


def _hierarchy() -> tuple[Path, bool] | None:
    """Where groups with a CPU quota can be made, and whether it is cgroup v2."""
    if "cpu" in _read(V2 / "cgroup.subtree_control").split() and os.access(V2, os.W_OK):
        return V2, True
    if (V1 / "cpu.cfs_quota_us").exists() and os.access(V1, os.W_OK):
        return V1, False
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class CpuQuota:
    """Processes each confined to `cpus` CPUs' time (0.5: half a core), each in a group of its own named `prefix`."""

    def __init__(self, cpus: float, prefix: str = "gateway-bench") -> None:
        self.cpus = cpus
        self.prefix = f"{prefix}-{os.getpid()}"
        self._groups: list[Path] = []
        self._where = _hierarchy() if cpus > 0 else None
        self._refused = False  # a process asked for could not be confined

    @property
    def confined(self) -> bool:
        """Whether every process asked for so far went into a group of its own with the quota."""
        return self._where is not None and not self._refused

    def confine(self, pid: int) -> None:
        """Move process `pid` (all its threads) into a new group with the quota (where none can be made, `confined`
        turns false)."""
        if self._where is None:
            return
        root, v2 = self._where
        group = root / f"{self.prefix}-{len(self._groups)}"
        try:
            group.mkdir()
            self._groups.append(group)
            quota = round(self.cpus * PERIOD_US)
            if v2:
                (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:
            self._refused = True

    def release(self) -> None:
        """Remove the groups whose processes have ended (a live one's group stays until it ends)."""
        left = []
        for group in self._groups:
            with contextlib.suppress(OSError):
                group.rmdir()
            if group.exists():
                left.append(group)
        self._groups = left
