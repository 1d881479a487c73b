"""The engine's command-line tools: write a random-weight checkpoint, convert a checkpoint into its graph,
build the compiled kernels."""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from .backend import MAX_POSITIONS
from .checkpoint import Checkpoint
from .config import SHAPES, CheckpointError
from .graph import DTYPES, GraphOptions
from .kernels.build import KERNELS_ENV, MANIFEST, KernelBuildError, build_library, build_variants
from .make_checkpoint import write_random_checkpoint
from .model_cache import compiled_model, default_cache_dir

# flag → ModelConfig field, for shapes other than the presets
SHAPE_FLAGS = {
    "--layers": "num_hidden_layers",
    "--experts": "num_experts",
    "--top-k": "experts_per_token",
    "--vocab": "vocab_size",
    "--hidden": "hidden_size",
    "--intermediate": "intermediate_size",
    "--heads": "num_attention_heads",
    "--kv-heads": "num_key_value_heads",
    "--head-dim": "head_dim",
}


class ProgressBar:
    """A one-line bar on a terminal; on a pipe or log, a line at every tenth."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self._tty = self.stream.isatty()
        self._tenth = -1

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        if self._tty:
            filled = round(fraction * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {done}/{total}" + ("\n" if done >= total else ""))
        elif int(fraction * 10) > self._tenth:
            self._tenth = int(fraction * 10)
            self.stream.write(f"{self.label}: {done}/{total}\n")
        self.stream.flush()


def add_commands(commands: argparse._SubParsersAction) -> None:
    make = commands.add_parser("make-checkpoint", help="write a random-weight gpt-oss checkpoint (its output is noise)")
    make.add_argument("directory", help="where to write config.json and the safetensors")
    make.add_argument("--shape", choices=sorted(SHAPES), default="demo", help="a preset shape (default: demo)")
    for flag, field in SHAPE_FLAGS.items():
        make.add_argument(flag, dest=field, type=int, help=f"override {field}")
    make.add_argument("--layout", choices=("original", "hf"), default="original", help="tensor names and config")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--shard-gib", type=float, default=2.0, help="largest shard in GiB (an index when several)")
    make.add_argument(
        "--zero-experts", action="store_true", help="experts all zero, left as holes in sparse files (speed checks)"
    )
    make.set_defaults(run=_make_checkpoint)
    convert = commands.add_parser("convert", help="convert a checkpoint into the engine's cached ONNX graph")
    convert.add_argument("checkpoint", help="a gpt-oss checkpoint directory, either layout")
    convert.add_argument("--max-positions", type=int, default=4096, help="the longest sequence (prompt + answer)")
    convert.add_argument("--page-size", type=int, default=32, help="positions per KV page, as the backend's page_size")
    convert.add_argument("--cache-dir", help=f"graph cache (default {default_cache_dir()})")
    convert.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="activations and non-expert weights (CUDA: bfloat16)"
    )
    convert.set_defaults(run=_convert)
    kernels = commands.add_parser("build-kernels", help="compile the engine's MXFP4 MoE kernels (CUDA too with nvcc)")
    kernels.add_argument("--march", default="native", help="instruction set, e.g. x86-64-v3 for portable images")
    kernels.add_argument("--output", help="also copy the library (and build.json) into this directory")
    kernels.add_argument(
        "--variants",
        action="store_true",
        help="build every CPU variant an image ships into --output (x86-64: x86-64, -v3, -v4, -v4 with VNNI); "
        f"with {KERNELS_ENV} naming that directory, the engine loads the best one the CPU runs",
    )
    kernels.set_defaults(run=_build_kernels)


def _make_checkpoint(args: argparse.Namespace) -> int:
    overrides = {field: getattr(args, field) for field in SHAPE_FLAGS.values() if getattr(args, field) is not None}
    config = replace(SHAPES[args.shape], **overrides)
    target = Path(args.directory)
    try:
        config.check("the requested shape")
        if target.exists() and any(target.iterdir()):
            raise CheckpointError(f"{target} is not empty")
        write_random_checkpoint(
            target,
            config,
            args.layout,
            args.seed,
            int(args.shard_gib * 1024**3),
            ProgressBar("tensors"),
            zero_experts=args.zero_experts,
        )
    except (CheckpointError, OSError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a random {args.layout}-layout checkpoint to {target}: its output is noise")
    return 0


def _convert(args: argparse.Namespace) -> int:
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    try:
        if not 16 <= args.max_positions <= MAX_POSITIONS:
            raise ValueError(f"--max-positions must be within 16..{MAX_POSITIONS}")
        if not 8 <= args.page_size <= 256:
            raise ValueError("--page-size must be within 8..256")
        checkpoint = Checkpoint(Path(args.checkpoint))
        options = GraphOptions(args.max_positions, args.dtype, page_size=args.page_size)
        model = compiled_model(checkpoint, options, cache, ProgressBar("layers"))
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    print(model)
    return 0


def _build_kernels(args: argparse.Namespace) -> int:
    if args.variants:
        if not args.output:
            print("gpt-oss-gateway: --variants needs --output", file=sys.stderr)
            return 2
        try:
            for library in build_variants(Path(args.output)):
                print(library)
        except (KernelBuildError, OSError) as exc:
            print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        library = build_library(march=args.march)
        if args.output:
            target = Path(args.output)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(library.parent / MANIFEST, target / MANIFEST)
            library = Path(shutil.copy2(library, target / library.name))
    except (KernelBuildError, OSError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    print(library)
    return 0
