"""What bounds the memory of a replica's sandboxes, and whether that fits the replica.

With a cgroup per sandbox (the gateway may create them under its own), the kernel holds all of a sandbox's
processes (its tmpfs files too) to `memory_mb` together. Without one (an unprivileged pod without a delegated
cgroup) only each process is bounded: `memory_mb` of address space, at most `processes` of them, so a sandbox
may reach `memory_mb × processes` and the replica's sandboxes that times `max_sandboxes`. That worst case must fit
the memory budget (`memory_budget_mb`, by default half of the container's memory: its cgroup's limit, else the
host's), or under `isolation: strict` python is not offered: a tenant's cells could otherwise take the pod's
memory and every tenant's streams with it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class MemoryBound:
    kind: Literal["cgroup", "per_process"]
    sandbox_mb: int  # the most one sandbox can hold
    replica_mb: int  # the most all of the replica's sandboxes can hold together
    budget_mb: int

    @property
    def fits(self) -> bool:
        return self.replica_mb <= self.budget_mb

    def as_log(self) -> dict[str, object]:
        return {"bound": self.kind, "sandbox_mb": self.sandbox_mb, "replica_mb": self.replica_mb,
                "budget_mb": self.budget_mb, "fits": self.fits}  # fmt: skip

    def refusal(self) -> str:
        return (
            f"without a cgroup per sandbox its memory is bounded per process only: memory_mb x processes x "
            f"max_sandboxes = {self.replica_mb} MiB, past the {self.budget_mb} MiB budget (memory_budget_mb); "
            "delegate a cgroup to the gateway (docs/hosted-tools.md) or lower those settings"
        )


def memory_bound(
    cgroup: bool, memory_mb: int, processes: int, max_sandboxes: int, budget_mb: int | None
) -> MemoryBound:
    sandbox_mb = memory_mb if cgroup else memory_mb * processes
    budget = budget_mb if budget_mb is not None else container_memory_mb() // 2
    return MemoryBound("cgroup" if cgroup else "per_process", sandbox_mb, sandbox_mb * max_sandboxes, budget)


def container_memory_mb(root: Path = ROOT, cgroup_file: Path = Path("/proc/self/cgroup")) -> int:
    """The memory this process's container may use: the lowest cgroup limit on its way up (v2, or v1's), else
    the host's."""
    limits = [_meminfo_total_bytes()]
    with contextlib.suppress(OSError, ValueError):
        for line in cgroup_file.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                group = root / path.lstrip("/")
                while group != root.parent and str(group).startswith(str(root)):
                    limits += _limit(group / "memory.max")
                    group = group.parent
            elif "memory" in controllers.split(","):
                limits += _limit(root / "memory" / path.lstrip("/") / "memory.limit_in_bytes")
    return min(limits) >> 20


def _limit(path: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        text = path.read_text().strip()
        if text != "max":
            return [int(text)]
    return []


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) << 10
    raise OSError("/proc/meminfo has no MemTotal")
