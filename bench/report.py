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
    """The CPU's name, its x86 family and model where /proc/cpuinfo gives them (a hypervisor's "AMD EPYC" names no
    generation: family 25 is Zen 3 or 4, 26 Zen 5), and the vector extensions that choose the kernels' paths."""
    name, fields = platform.processor() or platform.machine(), {}
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        key, _, value = line.partition(":")
        if not key.strip():
            break  # the first processor's fields only
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", name)
    family = fields.get("cpu family"), fields.get("model")
    where = f"family {family[0]} model {family[1]}; " if all(family) else ""
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")
    flags = ", ".join(flag for flag in wanted if flag in cpu_flags()) or "no vector extensions listed"
    return f"{name} ({where}{flags})"
