"""The CUDA decode attention's key split by step rows, per GPU model: the table a sweep on that GPU wrote
(`bench/engine_check.py --steps sweep`: every split timed at every row count and context, the fastest kept),
committed as attention_tuning.json beside this file and handed to the kernel in GATEWAY_ATTENTION_SPLITS
(attention_splits.h) for the device the engine runs. gpt-oss-20b and -120b share their attention's shape (64 query
heads, 8 KV heads of 64), so one entry serves both. A device the table does not name keeps the kernel's default;
an operator's own GATEWAY_ATTENTION_SPLITS wins over the table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .moe_tuning import GpuModel, read_table, set_from_table, table_entry, valid_table

SPLITS_ENV = "GATEWAY_ATTENTION_SPLITS"
TABLE = Path(__file__).with_name("attention_tuning.json")
# keys per split part a sweep times (0: not split); the kernel's default is 1,024
CANDIDATES = (0, 256, 512, 1024, 2048, 4096)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the decode buckets a CUDA graph captures
CONTEXTS = (1024, 4096, 16_384, 65_536, 131_072)  # positions a row's page table reaches
MAX_KEYS = 1 << 20
_ENTRY = re.compile(r"([1-9][0-9]{0,9})=(0|[1-9][0-9]{0,6})")


def valid(text: str) -> bool:
    """Whether `text` is a table the kernel reads: ROWS=KEYS entries, bounds increasing, ';' between."""
    return valid_table(text, _ENTRY, lambda match: int(match.group(2)) <= MAX_KEYS)


def lookup(table: dict[str, Any], gpu: GpuModel) -> str | None:
    """The table's splits for this GPU model, if it has them (and they are well formed)."""
    return table_entry(table, gpu, "splits", valid)


def apply(gpu: GpuModel | None, table_path: Path | None = None) -> str:
    """Sets GATEWAY_ATTENTION_SPLITS for `gpu` from the table, unless the operator set it; says which applies."""
    text = None if gpu is None else lookup(read_table(table_path or TABLE), gpu)
    return set_from_table(SPLITS_ENV, text, gpu, "")
