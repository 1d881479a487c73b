"""A CUDA kernel file compiled as host C++ with the warp-emulation shim (kernel_emulation/cuda_shim.h) and a
C driver beside it, loaded for the tests to call without a GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from backends.engine.kernels import build

HERE = Path(__file__).resolve().parent / "kernel_emulation"


def compile_emulated(source: str, driver: str, entry: str, directory: Path, optimize: str = "-O2") -> ctypes.CDLL:
    """`source` (a file of the kernel sources) with `driver` (a file here) as a shared library; `entry`, the
    driver's C function, returns a CUDA error string or None."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ is needed to compile the CUDA kernel for the host")
    kernels = build.source_dir()
    library = directory / f"lib{Path(source).stem}_emulated.so"
    command = [
        compiler, "-std=c++20", optimize, "-fPIC", "-shared", "-pthread", "-Wno-unknown-pragmas",
        "-include", str(HERE / "cuda_shim.h"), f"-I{kernels}",
        "-x", "c++", str(kernels / source), "-x", "c++", str(HERE / driver),
        "-o", str(library),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    handle = ctypes.CDLL(str(library))
    getattr(handle, entry).restype = ctypes.c_char_p
    return handle
