"""Built decoder graphs on disk, keyed by checkpoint, builder version and graph options, so that a
restart loads the graph instead of converting the checkpoint again."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from .checkpoint import Checkpoint
from .graph import BUILDER_VERSION, GraphOptions, build_model

MODEL_FILE = "decoder.onnx"
DATA_FILE = "decoder.onnx.data"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpt-oss-gateway" / "graphs"


def compiled_model(
    checkpoint: Checkpoint,
    options: GraphOptions,
    cache_dir: Path,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """The .onnx file for this checkpoint and these options, built (with external weights) if not cached."""
    key = f"{checkpoint.fingerprint}-b{BUILDER_VERSION}-p{options.max_positions}-cpu-fp32"
    target = cache_dir / key
    if (target / MODEL_FILE).is_file():
        return target / MODEL_FILE
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_dir))
    try:
        model = build_model(checkpoint, options, progress)
        onnx.save_model(
            model,
            str(scratch / MODEL_FILE),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=DATA_FILE,
        )
        try:
            scratch.rename(target)
        except OSError:  # another process built it first
            if not (target / MODEL_FILE).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target / MODEL_FILE
