"""Built decoder graphs on disk, keyed by checkpoint, builder version and graph options, so that a
restart loads the graph instead of converting the checkpoint again."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .checkpoint import Checkpoint
from .graph import BUILDER_VERSION, GraphOptions, write_model

MODEL_FILE = "decoder.onnx"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpt-oss-gateway" / "graphs"


def compiled_model(
    checkpoint: Checkpoint,
    options: GraphOptions,
    cache_dir: Path,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """The .onnx file for this checkpoint and these options, built (weights streamed to disk) if not cached."""
    dense = "-dense32" if not options.dense_bf16 else "-dense8" if options.dense_int8 else ""
    moe_int8 = {0: "", 1: "-act8"}.get(options.moe_int8_pieces, f"-act8x{options.moe_int8_pieces}")
    key = (
        f"{checkpoint.fingerprint}-b{BUILDER_VERSION}-p{options.max_positions}-g{options.page_size}"
        f"-{options.dtype}-{options.moe}{dense}{moe_int8}"
    )
    target = cache_dir / key
    if (target / MODEL_FILE).is_file():
        return target / MODEL_FILE
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_dir))
    try:
        write_model(checkpoint, options, scratch / MODEL_FILE, progress)
        try:
            scratch.rename(target)
        except OSError:  # another process built it first
            if not (target / MODEL_FILE).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target / MODEL_FILE
