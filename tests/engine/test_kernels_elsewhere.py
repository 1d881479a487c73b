"""The CPU kernels built for machines other than this one: 64-bit ARM (NEON) with a cross compiler, run under
qemu-user, and each x86-64 variant this CPU can run, through a harness that runs the dense kernels' blocks without
ONNX Runtime (kernel_checks/dense_check.cc) against a double-precision reference at gpt-oss's widths. Where the
cross compiler or qemu is missing the ARM check is skipped by name (CI installs both: .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from backends.engine.kernels import build
from backends.engine.kernels.variants import X86_VARIANTS, is_x86, runs_here

HARNESS = Path(__file__).parent / "kernel_checks" / "dense_check.cc"
FLAGS = ("-O2", "-std=c++17", "-DORT_API_MANUAL_INIT")


def _compile(compiler: str, flags: tuple[str, ...], output: Path) -> None:
    headers = build.headers_dir(build.default_cache_dir())
    command = [compiler, *FLAGS, *flags, f"-I{headers}", f"-I{build.source_dir()}", str(HARNESS), "-o", str(output)]
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
    dense kernels' NEON path equals the reference under qemu-user."""
    compiler, emulator = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if compiler is None or emulator is None:
        pytest.skip("ARM (NEON): no aarch64-linux-gnu-g++ or qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user)")
    monkeypatch.setenv("CXX", compiler)
    monkeypatch.setenv(build.HEADERS_ENV, str(build.headers_dir(build.default_cache_dir())))
    library = build.build_library(tmp_path / "cache", march="armv8-a", cuda=False)
    assert library.read_bytes()[18:20] == (183).to_bytes(2, "little")  # ELF e_machine: EM_AARCH64
    binary = tmp_path / "dense_check_arm"
    _compile(compiler, ("-march=armv8-a", "-static"), binary)
    _passes([emulator, str(binary), "--quick"], lanes=4)


@pytest.mark.parametrize("variant", X86_VARIANTS, ids=lambda v: v.name)
def test_each_x86_variant_this_cpu_runs_equals_the_reference(variant, tmp_path):
    if not is_x86() or not runs_here(variant):
        pytest.skip(f"{variant.name}: this CPU cannot run it")
    binary = tmp_path / f"dense_check_{variant.name}"
    _compile(shutil.which("g++") or "c++", variant.flags(), binary)
    _passes([str(binary)], lanes={"x86-64": 0, "x86-64-v3": 8}.get(variant.name, 16))
