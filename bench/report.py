"""The benchmark scripts' shared output: one marked section of docs/benchmarks.md per script."""

from __future__ import annotations

import platform
from pathlib import Path

from backends.engine.kernels.variants import cpu_flags  # the scripts put the project's root on sys.path first


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(path: Path, name: str, section: str, title: str = "Benchmarks") -> None:
    """Replace the script's section (its markers included in `section`), or append it."""
    start, end = markers(name)
    text = path.read_text() if path.exists() else f"# {title}\n\nFigures written by the scripts in `bench/`.\n"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def cpu_line() -> str:
    """The CPU's name and the vector extensions that choose the kernels' paths."""
    name = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            break
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")
    return f"{name} ({', '.join(flag for flag in wanted if flag in cpu_flags()) or 'no vector extensions listed'})"
