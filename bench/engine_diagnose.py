"""Where the device engine differs from the CPU one, and where its time goes.

    python bench/engine_diagnose.py --out DIR

1. The parity model's fp16 graph with its intermediate tensors exposed, run on the CPU and on CUDA over
   the same prompt: the largest difference per tensor, in graph order (the first that differs is the op).
2. ONNX Runtime's profile of a 20b-wide model (4 layers, bf16) on CUDA: a prefill and decode steps at
   batch 1 and 64, time per op type and provider.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import torch
except ImportError:
    torch = None

import numpy as np
import onnx
import onnxruntime as ort
from engine_check import PARITY_CONFIG, PROMPT

from backends.engine.checkpoint import Checkpoint
from backends.engine.config import GPT_OSS_20B
from backends.engine.graph import GraphOptions, kv_names
from backends.engine.make_checkpoint import write_random_checkpoint
from backends.engine.model_cache import compiled_model
from backends.engine.paged_runner import PagedRunner


def intermediates(work: Path, kernels: str | None) -> dict[str, object]:
    checkpoint = Checkpoint(write_random_checkpoint(work / "parity", PARITY_CONFIG, "original", seed=3))
    positions = 512
    path = compiled_model(checkpoint, GraphOptions(positions, "float16"), work / "graphs")
    model = onnx.load(str(path), load_external_data=False)
    names = []
    for node in model.graph.node:
        for output in node.output:
            if output and not output.startswith("present"):
                names.append(output)
    known = {o.name for o in model.graph.output}
    for name in names:
        if name not in known:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    exposed = path.with_name("exposed.onnx")
    exposed.write_bytes(model.SerializeToString())
    c = PARITY_CONFIG
    feeds = {
        "input_ids": np.array([PROMPT], np.int64),
        "seqlens_k": np.array([len(PROMPT) - 1], np.int32),
        "total_sequence_length": np.array(len(PROMPT), np.int32),
    }
    for layer in range(c.num_hidden_layers):
        for name in kv_names(layer)[:2]:
            feeds[name] = np.zeros((1, c.num_key_value_heads, positions, c.head_dim), np.float16)
    outputs = {}
    for provider in ("CPUExecutionProvider", "CUDAExecutionProvider"):
        options = ort.SessionOptions()
        if kernels:
            options.register_custom_ops_library(kernels)
        session = ort.InferenceSession(str(exposed), options, providers=[provider])
        wanted = [o.name for o in session.get_outputs()]
        outputs[provider] = dict(zip(wanted, session.run(wanted, feeds), strict=True))
    report = {}
    for name in ["logits", *names]:
        a, b = outputs["CPUExecutionProvider"].get(name), outputs["CUDAExecutionProvider"].get(name)
        if a is None or b is None or a.shape != b.shape or a.dtype.kind not in "fc":
            continue
        a, b = a.astype(np.float32), b.astype(np.float32)
        report[name] = {
            "max_abs_diff": float(np.abs(a - b).max()),
            "scale": float(np.abs(a).max()),
            "shape": list(a.shape),
        }
    return report


def sharing(work: Path, kernels: str | None) -> dict[str, object]:
    """Prompt logits of the parity model (fp16) on CUDA: plain run, KV shared in place (the runtime), KV
    bound to separate past and present buffers; each against the CPU's plain run."""
    checkpoint = Checkpoint(write_random_checkpoint(work / "parity", PARITY_CONFIG, "original", seed=3))
    positions = 512
    path = compiled_model(checkpoint, GraphOptions(positions, "float16"), work / "graphs")
    c = PARITY_CONFIG
    feeds = {
        "input_ids": np.array([PROMPT], np.int64),
        "seqlens_k": np.array([len(PROMPT) - 1], np.int32),
        "total_sequence_length": np.array(len(PROMPT), np.int32),
    }
    kv = (1, c.num_key_value_heads, positions, c.head_dim)
    for layer in range(c.num_hidden_layers):
        for name in kv_names(layer)[:2]:
            feeds[name] = np.zeros(kv, np.float16)

    def session(provider: str) -> ort.InferenceSession:
        options = ort.SessionOptions()
        if kernels:
            options.register_custom_ops_library(kernels)
        return ort.InferenceSession(str(path), options, providers=[provider])

    reference = session("CPUExecutionProvider").run(["logits"], feeds)[0]
    cuda = session("CUDAExecutionProvider")
    report: dict[str, object] = {"plain": float(np.abs(cuda.run(["logits"], feeds)[0] - reference).max())}
    for mode in ("shared", "separate"):
        binding = cuda.io_binding()
        keep = []
        for name in ("input_ids", "seqlens_k", "total_sequence_length"):
            binding.bind_cpu_input(name, feeds[name])
        for layer in range(c.num_hidden_layers):
            names = kv_names(layer)
            for past, present in ((names[0], names[2]), (names[1], names[3])):
                buffer = ort.OrtValue.ortvalue_from_numpy(np.zeros(kv, np.float16), "cuda", 0)
                binding.bind_ortvalue_input(past, buffer)
                if mode == "shared":
                    binding.bind_ortvalue_output(present, buffer)
                else:
                    other = ort.OrtValue.ortvalue_from_numpy(np.zeros(kv, np.float16), "cuda", 0)
                    binding.bind_ortvalue_output(present, other)
                    keep.append(other)
                keep.append(buffer)
        logits = ort.OrtValue.ortvalue_from_shape_and_type([1, c.vocab_size], np.float32, "cuda", 0)
        binding.bind_ortvalue_output("logits", logits)
        cuda.run_with_iobinding(binding)
        binding.synchronize_outputs()
        report[mode] = float(np.abs(logits.numpy() - reference).max())
    report["reference_scale"] = float(np.abs(reference).max())
    return report


def profile(work: Path, kernels: str | None) -> dict[str, object]:
    config = replace(GPT_OSS_20B, num_hidden_layers=4)
    checkpoint = Checkpoint(write_random_checkpoint(work / "wide", config, "original", seed=0))
    positions = 2048
    path = compiled_model(checkpoint, GraphOptions(positions, "bfloat16"), work / "graphs")
    report: dict[str, object] = {}
    runtime = PagedRunner.create(
        str(path), config, 64, positions, kernels=Path(kernels) if kernels else None, device="cuda", dtype="bfloat16"
    )
    prompt = [(31 * i) % 200000 + 5 for i in range(1024)]
    runtime.prefill(0, prompt[:16])
    started = time.perf_counter()
    runtime.prefill(0, prompt)
    report["prefill_1024_s"] = time.perf_counter() - started
    for batch in (1, 64):
        rows = [(slot, 1000 + slot, 1024) for slot in range(batch)]
        runtime.decode(rows)
        started = time.perf_counter()
        for i in range(10):
            runtime.decode([(s, t, p + 1 + i) for s, t, p in rows])
        report[f"decode_step_ms_batch_{batch}"] = (time.perf_counter() - started) / 10 * 1000
    # the same with ONNX Runtime's profiler on, to see where the time goes
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(work / "ort_profile")
    if kernels:
        options.register_custom_ops_library(kernels)
    runtime.session = ort.InferenceSession(
        str(path), options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    runtime._bindings.clear()
    runtime.prefill(0, prompt)
    for batch in (1, 64):
        rows = [(slot, 1000 + slot, 1024) for slot in range(batch)]
        for i in range(5):
            runtime.decode([(s, t, p + i) for s, t, p in rows])
    trace = json.loads(Path(runtime.session.end_profiling()).read_text())
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    report["model_run_ms"] = [round((end - start) / 1000, 3) for start, end in runs]
    phases = {"prefill_1024": runs[:1], "decode_batch_1": runs[1:6], "decode_batch_64": runs[6:11]}
    for phase, windows in phases.items():
        by_op: dict[str, float] = defaultdict(float)
        for event in trace:
            if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
                continue
            if any(start <= event["ts"] <= end for start, end in windows):
                args = event.get("args", {})
                by_op[f"{args.get('op_name')}@{args.get('provider')}"] += event.get("dur", 0) / 1000 / len(windows)
        report[f"ms_per_run_by_op_{phase}"] = {k: round(v, 3) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])}
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--steps", default="intermediates,sharing,profile")
    args = parser.parse_args()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="diagnose-"))
    kernels = os.environ.get("GATEWAY_ENGINE_KERNELS")
    results: dict[str, object] = {}
    for name, run in (("intermediates", intermediates), ("sharing", sharing), ("profile", profile)):
        if name not in args.steps:
            continue
        try:
            results[name] = run(work, kernels)
        except Exception as exc:
            import traceback

            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        (out / "diagnose.json").write_text(json.dumps(results, indent=1, default=str))
        print(name, json.dumps(results[name], default=str)[:4000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
