"""One gpt-oss MoE layer on the CPU: our compiled MXFP4MoE kernel against the pure-ONNX realization.

    python bench/moe_bench.py [--shape gpt-oss-20b] [--threads 0] [--repeats 5] [--write docs/benchmarks.md]

A decode step (1 token) and a prefill (512 tokens) through the same one-node model, in one process:
the pure-ONNX realization (GatherBlockQuantized of the routed experts + contrib MoE) and the compiled
kernel (MXFP4 decoded in registers, one pass over the packed bytes). The outputs are compared too.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import markers, write_section  # noqa: E402

from backends.engine.config import SHAPES  # noqa: E402
from backends.engine.graph import moe_layer_model  # noqa: E402
from backends.engine.kernels.build import build_library  # noqa: E402
from backends.engine.make_checkpoint import random_moe_layer  # noqa: E402

NAME = "moe_bench"
STEPS = {"decode (1 token)": 1, "prefill (512 tokens)": 512}


def _session(model: Path, threads: int, library: Path | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _best(session: ort.InferenceSession, feeds: dict[str, np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    out = session.run(None, feeds)[0]  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return min(times), out


def run(shape: str, threads: int, repeats: int) -> list[tuple[str, float, float, float]]:
    """(step, pure-ONNX seconds, kernel seconds, largest relative difference) per step."""
    config = SHAPES[shape]
    model = moe_layer_model(config, random_moe_layer(config, seed=0), Path(tempfile.mkdtemp(prefix="moe-bench-")))
    pure = _session(model, threads, None)
    compiled = _session(model, threads, build_library())
    rng = np.random.default_rng(0)
    rows = []
    for step, tokens in STEPS.items():
        feeds = {
            "x": rng.standard_normal((tokens, config.hidden_size)).astype(np.float32),
            "router_logits": rng.standard_normal((tokens, config.num_experts)).astype(np.float32),
        }
        pure_s, expected = _best(pure, feeds, repeats)
        kernel_s, got = _best(compiled, feeds, repeats)
        difference = float(np.abs(got - expected).max() / np.abs(expected).max())
        rows.append((step, pure_s, kernel_s, difference))
    return rows


def report(shape: str, rows: list[tuple[str, float, float, float]], threads: int) -> str:
    config = SHAPES[shape]
    start, end = markers(NAME)
    packed_mb = config.num_experts * 3 * config.hidden_size * config.intermediate_size * 17 / 32 / 1e6
    lines = [
        start,
        "## MXFP4 MoE layer, CPU (`bench/moe_bench.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
        f"intra-op threads {threads or 'one per core'}. One {shape}-shaped layer: {config.num_experts} experts, "
        f"top-{config.experts_per_token}, hidden {config.hidden_size}, {packed_mb:,.0f} MB of packed MXFP4 "
        "weights. Best of the repeats, both in the same process.",
        "",
        "| step | pure ONNX | compiled kernel | speed-up | largest difference (relative) |",
        "|---|---|---|---|---|",
    ]
    for step, pure_s, kernel_s, difference in rows:
        times = f"{pure_s * 1e3:,.1f} ms | {kernel_s * 1e3:,.1f} ms | {pure_s / kernel_s:.1f}x"
        lines.append(f"| {step} | {times} | {difference:.1e} |")
    lines += [
        "",
        "Target (issue 7): the kernel at least 3x faster than the pure-ONNX realization at decode.",
        end,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt-oss-20b")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: one per core)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", type=Path, help="markdown file whose MoE section is replaced")
    args = parser.parse_args()
    section = report(args.shape, run(args.shape, args.threads, args.repeats), args.threads)
    print(section)
    if args.write:
        write_section(args.write, NAME, section)


if __name__ == "__main__":
    main()
