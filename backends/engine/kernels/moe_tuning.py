"""The CUDA MoE's launch variant by step size, per GPU model: the table a sweep on that GPU wrote
(`bench/engine_check.py --steps sweep`: every variant timed at every step size, the fastest kept), committed as
moe_tuning.json beside this file and handed to the kernel in GATEWAY_MOE_VARIANTS (moe_variants.h) for the device
and model shape the engine runs. A device or shape the table does not name keeps the kernel's built-in rule; an
operator's own GATEWAY_MOE_VARIANTS wins over the table. The table helpers (validity, lookup, apply) serve
attention_tuning.py's table too."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger()

VARIANTS_ENV = "GATEWAY_MOE_VARIANTS"
TABLE = Path(__file__).with_name("moe_tuning.json")
# what a sweep times: the CUDA-core kernels, the tensor-core tiles with K in 1, 2, 4 or 8 parts, cuBLAS GEMMs
CANDIDATES = ("cores", "tiles/1", "tiles/2", "tiles/4", "tiles/8", "gemm")
# the step sizes a sweep times: every decode bucket a CUDA graph captures, then prefill steps
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
MAX_ENTRIES = 32  # moe_variants.h's kMaxMoeVariants, attention_splits.h's kMaxAttentionSplitEntries
_ENTRY = re.compile(r"([1-9][0-9]{0,9})=(cores|gemm|tiles/(?:[1-9]|1[0-6]))")
_CU_COMPUTE_MAJOR, _CU_COMPUTE_MINOR = 75, 76  # CUdevice_attribute


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str  # as the driver names it, e.g. "NVIDIA H200"
    capability: str  # compute capability, e.g. "9.0"


def valid_table(text: str, entry: re.Pattern[str], within: Callable[[re.Match[str]], bool] | None = None) -> bool:
    """Whether `text` is a table of `entry` entries (each also `within` its bounds), their first numbers increasing,
    ';' between, at most MAX_ENTRIES (the kernels keep as many): the shape moe_variants.h and attention_splits.h
    read."""
    bounds = []
    for item in text.split(";"):
        match = entry.fullmatch(item)
        if match is None or (within is not None and not within(match)):
            return False
        bounds.append(int(match.group(1)))
    return len(bounds) <= MAX_ENTRIES and all(a < b for a, b in itertools.pairwise(bounds))


def valid(text: str) -> bool:
    """Whether `text` is a table the kernel reads: TOKENS=VARIANT entries, bounds increasing, ';' between."""
    return valid_table(text, _ENTRY)


def compact(fastest: dict[int, str]) -> str:
    """The table text of the fastest variant per step size: a run of sizes with one variant as one entry (its
    largest size its bound)."""
    entries: list[tuple[int, str]] = []
    for size in sorted(fastest):
        if entries and entries[-1][1] == fastest[size]:
            entries[-1] = (size, fastest[size])
        else:
            entries.append((size, fastest[size]))
    return ";".join(f"{size}={variant}" for size, variant in entries)


def table_entry(
    table: dict[str, Any], gpu: GpuModel, field: str, well_formed: Callable[[str], bool], **shape: Any
) -> str | None:
    """The `field` of the table's entry for this GPU model (and `shape`'s other keys), if it has one and it is well
    formed."""
    wanted = {"device": gpu.name, "compute_capability": gpu.capability, **shape}
    for entry in table.get("tables", []):
        if all(entry.get(key) == value for key, value in wanted.items()):
            text = entry.get(field)
            return text if isinstance(text, str) and well_formed(text) else None
    return None


def lookup(table: dict[str, Any], gpu: GpuModel, experts: int) -> str | None:
    """The table's variants for this GPU model and number of experts, if it has them (and they are well formed)."""
    return table_entry(table, gpu, "variants", valid, experts=experts)


def cuda_gpu(ordinal: int = 0) -> GpuModel | None:
    """The GPU at `ordinal` as the CUDA driver names it (None without a driver or such a device)."""
    with contextlib.suppress(OSError, AttributeError):
        driver = ctypes.CDLL("libcuda.so.1")
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if (
            driver.cuInit(0) == 0
            and driver.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            and driver.cuDeviceGetName(name, len(name), device) == 0
            and driver.cuDeviceGetAttribute(ctypes.byref(major), _CU_COMPUTE_MAJOR, device) == 0
            and driver.cuDeviceGetAttribute(ctypes.byref(minor), _CU_COMPUTE_MINOR, device) == 0
        ):
            return GpuModel(name.value.decode(errors="replace"), f"{major.value}.{minor.value}")
    return None


def read_table(path: Path) -> dict[str, Any]:
    """A tuning table's JSON ({} where it cannot be read)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def set_from_table(env: str, text: str | None, gpu: GpuModel | None, shape: str) -> str:
    """Sets `env` to a table's entry `text` for `gpu` and `shape` (None: the table has none), unless the operator set
    it; says which applies (for the log and /readyz). Read by the kernels when a session is created."""
    own = os.environ.get(env)
    if own is not None:
        return f"{env} as set: {own[:200]}"
    if text is None or gpu is None:
        where = "no GPU named" if gpu is None else f"{gpu.name} ({gpu.capability}){shape}"
        log.info("engine_kernel_tuning", variable=env, source="built-in rule", reason=f"no entry for {where}")
        return "built-in rule"
    os.environ[env] = text
    log.info("engine_kernel_tuning", variable=env, source="table", device=gpu.name, shape=shape, table=text)
    return f"tuned for {gpu.name} ({gpu.capability}): {text}"


def apply(experts: int, gpu: GpuModel | None, table_path: Path | None = None) -> str:
    """Sets GATEWAY_MOE_VARIANTS for a model of `experts` experts on `gpu` from the table, unless the operator set
    it; says which applies."""
    text = None if gpu is None else lookup(read_table(table_path or TABLE), gpu, experts)
    return set_from_table(VARIANTS_ENV, text, gpu, f" with {experts} experts")
