"""What the machine looks like around a test run (load, memory, disk, the busiest processes), for CI's log."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


def _mem_available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def _busiest_processes(count: int) -> list[str]:
    try:
        listing = subprocess.run(
            ["ps", "-eo", "pid,pcpu,rss,etimes,comm", "--sort=-pcpu"], capture_output=True, text=True, timeout=5
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []
    return listing[: count + 1]


def machine_state_lines() -> list[str]:
    """Load average, available memory, free space in the temporary directory and the busiest processes."""
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    memory = _mem_available_gib()
    free_disk = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    memory_text = "unknown" if memory is None else f"{memory:.1f} GiB"
    summary = f"machine: {os.cpu_count()} CPUs, load {load}, memory available {memory_text}"
    lines = [f"{summary}, temp free {free_disk:.1f} GiB"]
    return lines + [f"  {row}" for row in _busiest_processes(5)]
