"""The CPU kernels built for machines other than this one: 64-bit ARM (NEON) with a cross compiler, run under
qemu-user, and each x86-64 variant this CPU can run, through harnesses that run the kernels' inner parts without
ONNX Runtime against a double-precision reference at gpt-oss's widths: the dense kernels' blocks
(kernel_checks/dense_check.cc) and the MoE kernel's dot products of MXFP4 rows, float, int8 and tiled
(kernel_checks/moe_check.cc). Where the cross compiler or qemu is missing the ARM check is skipped by name (CI
installs both: .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from backends.engine.kernels import build
from backends.engine.kernels.variants import X86_VARIANTS, is_x86, runs_here

HARNESSES = ("dense_check", "moe_check")  # kernel_checks/NAME.cc
FLAGS = ("-O2", "-std=c++17", "-DORT_API_MANUAL_INIT")


def _compile(harness: str, compiler: str, flags: tuple[str, ...], output: Path) -> None:
    headers = build.headers_dir(build.default_cache_dir())
    source = Path(__file__).parent / "kernel_checks" / f"{harness}.cc"
    command = [compiler, *FLAGS, *flags, f"-I{headers}", f"-I{build.source_dir()}", str(source), "-o", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def _passes(command: list[str], lanes: int) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"vector lanes {lanes}", lines[0]  # the vector path ran, not the plain C++ fallback
    assert len(lines) > 6 and all(line.startswith("ok ") for line in lines[1:]), result.stdout


def test_the_arm_build_equals_the_reference_under_qemu(monkeypatch, tmp_path):
    """The whole library builds for 64-bit ARM the way it builds here (build.py, $CXX the cross compiler), and the
    dense and MoE kernels' NEON paths equal the reference under qemu-user."""
    compiler, emulator = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if compiler is None or emulator is None:
        pytest.skip("ARM (NEON): no aarch64-linux-gnu-g++ or qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user)")
    monkeypatch.setenv("CXX", compiler)
    monkeypatch.setenv(build.HEADERS_ENV, str(build.headers_dir(build.default_cache_dir())))
    library = build.build_library(tmp_path / "cache", march="armv8-a", cuda=False)
    assert library.read_bytes()[18:20] == (183).to_bytes(2, "little")  # ELF e_machine: EM_AARCH64
    for harness in HARNESSES:
        binary = tmp_path / f"{harness}_arm"
        _compile(harness, compiler, ("-march=armv8-a", "-static"), binary)
        _passes([emulator, str(binary), "--quick"], lanes=4)
    # the MoE's int8 path on the dot-product instructions (Armv8.2 and later, as a native build on Graviton 2 has)
    binary = tmp_path / "moe_check_arm_dotprod"
    _compile("moe_check", compiler, ("-march=armv8.2-a+dotprod", "-static"), binary)
    _passes([emulator, "-cpu", "max", str(binary)], lanes=4)


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("variant", X86_VARIANTS, ids=lambda v: v.name)
def test_each_x86_variant_this_cpu_runs_equals_the_reference(variant, harness, tmp_path):
    if not is_x86() or not runs_here(variant):
        pytest.skip(f"{variant.name}: this CPU cannot run it")
    binary = tmp_path / f"{harness}_{variant.name}"
    _compile(harness, shutil.which("g++") or "c++", variant.flags(), binary)
    _passes([str(binary)], lanes={"x86-64": 0, "x86-64-v3": 8, "x86-64-v4": 16}[variant.march])
