"""The python sandbox's start-up cost, beside the plain interpreter and bubblewrap, in one run.

    python bench/sandbox_start_bench.py [--runs 40] [--write docs/benchmarks.md]

Each variant starts an interpreter, runs `1 + 1` in it, and ends it, `runs` times in turn:
- plain: `python -I -S -c 'print(1 + 1)'` as a subprocess, unconfined (the floor);
- gateway sandbox: `SandboxPool` opens a container (namespaces, private root, seccomp, cgroup, uid) and runs the
  cell, then closes it (the time a new container's first cell adds);
- bubblewrap: `bwrap` with the same namespaces and a comparable read-only view of the system, no seccomp filter,
  running the same command;
- warm cell: one more cell in an open sandbox (what every later cell of a container costs).
Medians and 90th percentiles in milliseconds, and each median's ratio to the plain interpreter's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import markers, write_section  # noqa: E402
from gateway.hosted.sandbox import SandboxPool, SandboxSettings  # noqa: E402

NAME = "sandbox-start"
PYTHON = sys.executable


def _plain() -> None:
    subprocess.run([PYTHON, "-I", "-S", "-c", "print(1 + 1)"], check=True, capture_output=True)


def _bubblewrap_command() -> list[str]:
    command = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for directory in ("/usr", "/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(directory):
            command += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            command += ["--ro-bind", directory, directory]
    for directory in {sys.base_prefix, os.path.dirname(PYTHON)}:
        if not directory.startswith("/usr/"):
            command += ["--ro-bind", directory, directory]
    command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
    return [*command, PYTHON, "-I", "-S", "-c", "print(1 + 1)"]


def _timed(run, runs: int) -> list[float]:
    run()  # warm the page cache
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _sandbox_times(runs: int) -> tuple[list[float], list[float], dict[str, bool]]:
    pool = SandboxPool(SandboxSettings(enabled=True, python=PYTHON))
    await pool.probe()
    if pool.unavailable:
        raise SystemExit(f"the sandbox cannot start here: {pool.unavailable}")
    first, warm = [], []
    for index in range(runs + 1):
        started = time.perf_counter()
        assert (await pool.run("bench", f"cntr_{index}", "1 + 1")).output == "2\n"
        opened = time.perf_counter()
        assert (await pool.run("bench", f"cntr_{index}", "1 + 1")).output == "2\n"
        warmed = time.perf_counter()
        await pool.aclose()
        closed = time.perf_counter()
        if index:  # the first run warms the page cache
            first.append((opened - started + closed - warmed) * 1000)
            warm.append((warmed - opened) * 1000)
    assert pool.isolation is not None
    return first, warm, pool.isolation.as_log()


def _row(name: str, times: list[float], floor: float) -> str:
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10)[-1]
    return f"| {name} | {median:.1f} | {p90:.1f} | {median / floor:.2f}× |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    plain = _timed(_plain, args.runs)
    first, warm, isolation = asyncio.run(_sandbox_times(args.runs))
    floor = statistics.median(plain)
    rows = [_row("plain interpreter (no confinement)", plain, floor)]
    rows.append(_row("gateway sandbox: open, first cell, close", first, floor))
    if shutil.which("bwrap"):
        command = _bubblewrap_command()
        rows.append(
            _row(
                "bubblewrap, same command",
                _timed(lambda: subprocess.run(command, check=True, capture_output=True), args.runs),
                floor,
            )
        )
    rows.append(_row("gateway sandbox: a later cell (warm)", warm, floor))
    got = ", ".join(name for name, held in isolation.items() if held)
    start, end = markers(NAME)
    section = "\n".join(
        [
            start,
            "## Python sandbox start-up",
            "",
            f"`python bench/sandbox_start_bench.py --runs {args.runs}` on {platform.machine()}, {os.cpu_count()} CPUs, "
            f"as uid {os.getuid()}; Python {platform.python_version()}. The sandbox got: {got}.",
            "",
            "| variant | median ms | p90 ms | median ÷ plain |",
            "|---|---|---|---|",
            *rows,
            "",
            "A new container pays the first row's difference to the plain interpreter once; each later cell costs",
            "the last row. docs/hosted-tools.md weighs these figures in choosing our own worker over bubblewrap.",
            end,
        ]
    )
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
