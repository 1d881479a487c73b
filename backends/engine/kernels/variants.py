"""The CPU variants the kernels are built in, and the one a machine runs: the best whose instructions its CPU has.

One image serves every node: `build-kernels --variants` compiles the library once per variant (x86-64: the baseline,
x86-64-v3 with AVX2 and FMA, x86-64-v3 with AVX-VNNI (Intel's AVX2-only E-core Xeons and its clients from Alder Lake:
the MoE's int8 decode takes byte dot products in one instruction), x86-64-v4 with AVX-512, x86-64-v4 with VNNI, and
x86-64-v4 with VNNI, AVX-512 BF16 and AMX tiles, whose prefill runs on the tiles (amx_cpu.h); elsewhere the machine's
own), and the engine loads the best one the CPU reports (as ONNX Runtime's MLAS and llama.cpp's CPU backends choose at
load), so no kernel can stop a node with an illegal instruction and none runs below what the node can do.
"""

from __future__ import annotations

import functools
import json
import platform
from dataclasses import dataclass
from pathlib import Path

VARIANTS_FILE = "variants.json"


@dataclass(frozen=True)
class Variant:
    name: str
    march: str  # the compiler's -march
    extensions: tuple[str, ...] = ()  # more -m flags
    needs: frozenset[str] = frozenset()  # the CPU flags (as /proc/cpuinfo names them) it runs on

    def flags(self) -> tuple[str, ...]:
        return (f"-march={self.march}", *(f"-m{extension}" for extension in self.extensions))


_V3 = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_AMX = _V4 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}
X86_VARIANTS = (  # best first
    Variant("x86-64-v4-amx", "x86-64-v4", ("avx512vnni", "avx512bf16", "amx-tile", "amx-bf16"), _AMX),
    Variant("x86-64-v4-vnni", "x86-64-v4", ("avx512vnni",), _V4 | {"avx512_vnni"}),
    Variant("x86-64-v4", "x86-64-v4", (), _V4),
    Variant("x86-64-v3-vnni", "x86-64-v3", ("avxvnni",), _V3 | {"avx_vnni"}),
    Variant("x86-64-v3", "x86-64-v3", (), _V3),
    Variant("x86-64", "x86-64"),
)
NATIVE = Variant("native", "native")


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def variants() -> tuple[Variant, ...]:
    """The variants built for this machine's architecture, best first."""
    return X86_VARIANTS if is_x86() else (NATIVE,)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (empty where /proc/cpuinfo has none: only the baseline runs)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def runs_here(variant: Variant, flags: frozenset[str] | None = None) -> bool:
    return variant.needs <= (cpu_flags() if flags is None else flags)


def best(names: list[str], flags: frozenset[str] | None = None) -> Variant | None:
    """Of the variants named (those a directory holds), the best the CPU runs; None if it runs none of them."""
    for variant in variants():
        if variant.name in names and runs_here(variant, flags):
            return variant
    return None


def level() -> str:
    """The best variant this CPU runs: what a library built for the machine's own instruction set amounts to."""
    return next(variant.name for variant in variants() if runs_here(variant))


def write_index(directory: Path, built: list[Variant]) -> None:
    """The variants a directory holds (each in its own subdirectory), for `choose` to read."""
    (directory / VARIANTS_FILE).write_text(json.dumps({"variants": [variant.name for variant in built]}, indent=1))


def choose(directory: Path, library: str) -> tuple[Path, Variant] | None:
    """The library of the best variant in `directory` (written by write_index) this CPU runs."""
    names = json.loads((directory / VARIANTS_FILE).read_text())["variants"]
    variant = best([name for name in names if (directory / name / library).is_file()])
    return None if variant is None else (directory / variant.name / library, variant)
