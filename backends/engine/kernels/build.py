"""Building the engine's compiled kernels from source, on first use, into the cache.

The C++ sources ship with the package; the ONNX Runtime C/C++ API headers are not in any Python wheel,
so they are fetched once from a package registry (npm `com.github.asus4.onnxruntime`, which carries the
full header set), checked against the registry's sha512, and kept in the cache. `GATEWAY_ORT_HEADERS`
names a directory holding them instead (for offline machines). The library is built with the machine's
own instruction set, keyed by the sources, the compiler and its flags.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from .variants import VARIANTS_FILE, Variant, choose, level, variants, write_index

log = structlog.get_logger("backends.engine")

HEADERS_PACKAGE = "com.github.asus4.onnxruntime"
HEADERS_VERSION = "0.4.9"  # ORT_API_VERSION 29: onnxruntime 1.31 accepts libraries built against it
HEADERS_URL = f"https://registry.npmjs.org/{HEADERS_PACKAGE}/-/{HEADERS_PACKAGE}-{HEADERS_VERSION}.tgz"
HEADERS_SHA512 = "BkzxduSZ9IkeDP6Q8lz2TFU2ie7hSSvS7ZIfzMooExoq0CNzJnuuGaUJ7IsojBgqO4ouD1jXah8OYyJbCN29Fg=="
HEADERS_IN_TARBALL = (
    "package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers/"
)
HEADERS_ENV = "GATEWAY_ORT_HEADERS"
KERNELS_ENV = "GATEWAY_ENGINE_KERNELS"  # "0": none; a path: that prebuilt library; unset: build on first use
DOWNLOAD_TIMEOUT_S = 300
LIBRARY = "libgptoss_engine_kernels.so"
SOURCES = (
    "mxfp4_moe_op.cc",
    "mxfp4_moe_cpu.cc",
    "sample_tokens_op.cc",
    "sample_tokens_cpu.cc",
    "dense_cpu.cc",
    "paged_attention_op.cc",
    "paged_attention_cpu.cc",
    "register.cc",
    "amx_cpu.cc",
    "moe_int_tiles_cpu.cc",
)
# the kernels' own headers
HEADERS = (
    "mxfp4_moe_op.h",
    "mxfp4_moe_launch.h",
    "moe_variants.h",
    "attention_splits.h",
    "sample_tokens_op.h",
    "sample_tokens_launch.h",
    "cuda_launch.h",
    "dense_op.h",
    "weight_batches.h",
    "simd_cpu.h",
    "amx_cpu.h",
    "moe_int_tiles_cpu.h",
    "mxfp4_cpu.h",
    "kernel_dtype.h",
    "ort_dtype.h",
    "cuda_numbers.h",
    "cuda_mma.h",
    "paged_attention_op.h",
    "paged_attention_launch.h",
)
CXX_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-pthread")
CUDA_ENV = "GATEWAY_ENGINE_CUDA"  # "0": build the CPU kernel only
MOE_CUDA_SOURCE = "mxfp4_moe_cuda.cu"
SAMPLE_CUDA_SOURCE = "sample_tokens_cuda.cu"
ATTENTION_CUDA_SOURCE = "paged_attention_cuda.cu"
CUDA_SOURCES = (MOE_CUDA_SOURCE, SAMPLE_CUDA_SOURCE, ATTENTION_CUDA_SOURCE)
CUDA_HOST_SOURCES = ("mxfp4_moe_cuda_op.cc", "paged_attention_cuda_op.cc")
CUDA_ARCHS = ("sm_80", "sm_90")
CUDA_FLAGS = (
    "-O3",
    "-std=c++17",
    "-Xcompiler",
    "-fPIC",
    *(flag for arch in CUDA_ARCHS for flag in ("-gencode", f"arch=compute_{arch[3:]},code={arch}")),
    # PTX of the newest architecture too, so that newer GPUs compile it at load (forward compatibility)
    "-gencode",
    f"arch=compute_{CUDA_ARCHS[-1][3:]},code=compute_{CUDA_ARCHS[-1][3:]}",
)
MANIFEST = "build.json"
DEFINES = ("-DORT_API_MANUAL_INIT",)


class KernelBuildError(RuntimeError):
    """The kernels could not be built here; the message says what is missing."""


def source_dir() -> Path:
    return Path(__file__).resolve().parent


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpt-oss-gateway" / "kernels"


def _download_headers(target: Path) -> None:
    with urllib.request.urlopen(HEADERS_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
        data = response.read()
    digest = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != HEADERS_SHA512:
        raise KernelBuildError(f"{HEADERS_URL}: sha512 mismatch (got {digest})")
    scratch = Path(tempfile.mkdtemp(prefix=".headers.", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive:
                name = member.name.removeprefix(HEADERS_IN_TARBALL)
                if member.isfile() and name != member.name and "/" not in name and name.endswith(".h"):
                    extracted = archive.extractfile(member)
                    assert extracted is not None
                    (scratch / name).write_bytes(extracted.read())
        if not (scratch / "onnxruntime_cxx_api.h").is_file():
            raise KernelBuildError(f"{HEADERS_URL}: no onnxruntime_cxx_api.h under {HEADERS_IN_TARBALL}")
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def headers_dir(cache: Path) -> Path:
    """A directory with onnxruntime_cxx_api.h and its siblings: $GATEWAY_ORT_HEADERS, the cache, or npm."""
    explicit = os.environ.get(HEADERS_ENV)
    if explicit:
        path = Path(explicit)
        if not (path / "onnxruntime_cxx_api.h").is_file():
            raise KernelBuildError(f"{HEADERS_ENV}={explicit} holds no onnxruntime_cxx_api.h")
        return path
    target = cache / f"ort-headers-{HEADERS_VERSION}"
    if not (target / "onnxruntime_cxx_api.h").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        log.info("engine_headers_fetching", into=str(target), note=f"once per machine; {HEADERS_ENV} avoids it")
        try:
            _download_headers(target)
        except OSError as exc:
            if not (target / "onnxruntime_cxx_api.h").is_file():  # not another process winning the rename
                raise KernelBuildError(
                    f"the ONNX Runtime headers could not be fetched ({exc}); set {HEADERS_ENV}"
                ) from exc
    return target


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler (g++, or $CXX)")
    return compiler


def find_nvcc() -> Path | None:
    """nvcc from the nvidia-cuda-nvcc wheel (the `cuda` and `test` extras), else on PATH; None: CPU only."""
    if os.environ.get(CUDA_ENV) == "0":
        return None
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(location).glob("cu*/bin/nvcc")):
            return candidate
    found = shutil.which("nvcc")
    return Path(found) if found else None


def _version(tool: str | Path) -> str:
    """`tool --version`, down to its name and version number."""
    output = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False).stdout
    number = re.search(r"\d+\.\d+(\.\d+)?", output.split("release")[-1])
    return f"{Path(tool).name} {number.group(0) if number else output.strip()[:80]}"


def _build_key(tools: list[str], flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS, *CUDA_SOURCES, *CUDA_HOST_SOURCES):
        digest.update((source_dir() / name).read_bytes())
    for part in (*tools, *flags, *CUDA_FLAGS, HEADERS_VERSION):
        digest.update(part.encode())
    return digest.hexdigest()[:20]


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KernelBuildError(f"the kernel build failed: {' '.join(command[:2])} ...\n{result.stderr[-4000:]}")


def _compile_and_link(
    compiler: str, flags: tuple[str, ...], headers: Path, nvcc: Path | None, cache: Path, scratch: Path, output: Path
) -> None:
    """Objects in parallel (g++ for the C++, nvcc for the CUDA kernels), then one shared library. The CUDA objects
    do not depend on the CPU's instruction set: they are kept in the cache and shared by every variant's build."""
    sources = [*SOURCES, *(CUDA_HOST_SOURCES if nvcc else ())]
    defines = ("-DGPTOSS_WITH_CUDA",) if nvcc else ()
    jobs = [
        [compiler, "-c", *flags, *defines, f"-I{headers}", str(source_dir() / name), "-o", str(scratch / f"{name}.o")]
        for name in sources
    ]
    cuda_objects = cache / f"cuda-objects-{_build_key([_version(nvcc)], ())}" if nvcc else None
    if nvcc and cuda_objects and not all((cuda_objects / f"{name}.o").is_file() for name in CUDA_SOURCES):
        for name in CUDA_SOURCES:
            jobs.append([str(nvcc), "-c", *CUDA_FLAGS, str(source_dir() / name), "-o", str(scratch / f"{name}.o")])
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        list(pool.map(_run, jobs))
    if nvcc and cuda_objects:
        cuda_objects.mkdir(parents=True, exist_ok=True)
        for name in CUDA_SOURCES:
            built, kept = scratch / f"{name}.o", cuda_objects / f"{name}.o"
            if built.is_file():
                shutil.copy2(built, kept)
            else:
                shutil.copy2(kept, built)
    objects = [str(path) for path in sorted(scratch.glob("*.o"))]
    if nvcc:
        libraries = [f"-L{nvcc.parent.parent / name}" for name in ("lib", "lib64")]
        _run([str(nvcc), "-shared", "-cudart", "static", *libraries, *objects, "-o", str(output)])
    else:
        _run([compiler, "-shared", *objects, "-o", str(output)])


def build_library(
    cache: Path | None = None, march: str = "native", cuda: bool = True, extensions: tuple[str, ...] = ()
) -> Path:
    """The compiled kernel library, built if this machine has not built these sources yet.

    `march` and `extensions` (more -m flags): the instruction set (the machine's own by default: the library is
    built where it runs; variants.py names those an image ships). The CUDA kernel is compiled in (for sm_80 and
    sm_90) when nvcc is found, unless `cuda` is false (a build for the CPU paths alone); `build.json` beside the
    library says what it holds.
    """
    cache = cache or default_cache_dir()
    compiler = _compiler()
    nvcc = find_nvcc() if cuda else None
    variant = Variant(march, march, extensions)
    flags = (*CXX_FLAGS, *variant.flags(), *DEFINES)
    tools = [_version(compiler), _version(nvcc) if nvcc else "no nvcc"]
    target = cache / _build_key(tools, flags) / LIBRARY
    if target.is_file():
        return target
    headers = headers_dir(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build.", dir=target.parent))
    started = time.monotonic()
    log.info("engine_kernels_building", into=str(target.parent), cuda=nvcc is not None, note="once per machine")
    try:
        _compile_and_link(compiler, flags, headers, nvcc, cache, scratch, scratch / LIBRARY)
        manifest = {
            "cuda": nvcc is not None,
            "cuda_archs": list(CUDA_ARCHS) if nvcc else [],
            "tools": tools,
            "cpu_flags": list(variant.flags()),
        }
        (target.parent / MANIFEST).write_text(json.dumps(manifest, indent=1))
        (scratch / LIBRARY).replace(target)
        log.info("engine_kernels_built", seconds=round(time.monotonic() - started, 1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def build_variants(output: Path, cache: Path | None = None, cuda: bool = True) -> list[Path]:
    """The library in every CPU variant of this architecture (variants.py), each under `output`/<variant>/ with
    its build.json, and the index the engine chooses from at load."""
    built = []
    for variant in variants():
        library = build_library(cache, variant.march, cuda, variant.extensions)
        target = output / variant.name
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library.parent / MANIFEST, target / MANIFEST)
        built.append(Path(shutil.copy2(library, target / LIBRARY)))
    write_index(output, list(variants()))
    return built


def kernel_library(cache: Path | None = None) -> Path | None:
    """The library to register with ONNX Runtime (kernel_choice's), or None."""
    choice = kernel_choice(cache)
    return None if choice is None else choice.path


@functools.cache
def kernel_choice(cache: Path | None = None) -> KernelLibrary | None:
    """The library to register with ONNX Runtime, or None (said once) where it cannot be built: $GATEWAY_ENGINE_KERNELS
    names a library, or a directory of variants (`build-kernels --variants`: the best this CPU runs is taken);
    unset, the library is built for this machine's own instruction set."""
    setting = os.environ.get(KERNELS_ENV, "")
    if setting == "0":
        log.info("engine_kernels_off", reason=f"{KERNELS_ENV}=0")
        return None
    if setting:
        path = Path(setting)
        if (path / VARIANTS_FILE).is_file():
            chosen = choose(path, LIBRARY)
            if chosen is None:
                reason = f"{KERNELS_ENV}={setting}: no variant runs on this CPU"
                log.warning("engine_kernels_unavailable", reason=reason)
                return None
            library, variant = chosen
            log.info("engine_kernels_variant", variant=variant.name, library=str(library))
            return KernelLibrary(library, variant.name, variant.name)
        if path.is_file():
            return _prebuilt(path)
        log.warning("engine_kernels_unavailable", reason=f"{KERNELS_ENV}={setting} is not a file")
        return None
    try:
        return KernelLibrary(build_library(cache), f"native ({level()} level)", level())
    except (KernelBuildError, OSError) as exc:
        log.warning("engine_kernels_unavailable", reason=str(exc), fallback="the pure-ONNX MXFP4 MoE")
        return None


@dataclass(frozen=True)
class KernelLibrary:
    path: Path
    variant: str  # the CPU variant it was built for, as /readyz names it
    level: str  # the variant (variants.py) whose instructions it uses at most: "unknown" if no build.json says


def _prebuilt(library: Path) -> KernelLibrary:
    """A library named by path: its variant from the build.json beside it ("unknown" without one)."""
    try:
        flags = tuple(json.loads((library.parent / MANIFEST).read_text())["cpu_flags"])
    except (OSError, ValueError, KeyError, TypeError):
        return KernelLibrary(library, "unknown", "unknown")
    known = next((variant.name for variant in variants() if variant.flags() == flags), None)
    described = " ".join(flags).replace("-march=", "")
    return KernelLibrary(library, known or described, known or ("native" if "-march=native" in flags else "unknown"))
