"""The CUDA MoE kernel's launch variants timed at every step size on the GPU at hand, the fastest kept as the table
the engine reads at load (backends/engine/kernels/moe_tuning.py), as vLLM ships its fused-MoE launch parameters per
GPU and batch size. engine_check's `sweep` step:

    python bench/engine_check.py --device cuda --steps sweep --out DIR

For gpt-oss-20b's and -120b's MoE layers (32 and 128 experts, bf16 activations): each variant of
moe_tuning.CANDIDATES (CUDA cores; tensor-core tiles with K in 1, 2, 4 or 8 parts; cuBLAS GEMMs) forced for every
step size through GATEWAY_MOE_VARIANTS, and the kernel's built-in rule, timed at every size of moe_tuning.BUCKETS
(the decode buckets a CUDA graph captures, then prefill steps), each variant's output checked against the CUDA
cores' at three sizes; 20b's layer on ONNX Runtime's QMoE too, the bar the table must not lose to. The fastest
variant per size, as table text, goes to DIR/moe_tuning.json (in the committed table's format) and, on the
machine that ran it, into the package's table, so that later steps of the same window run tuned.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from kernel_session import kernel_session
from qmoe_layer import qmoe_layer_model

from backends.engine.config import GPT_OSS_20B, GPT_OSS_120B, ModelConfig
from backends.engine.graph import GraphOptions
from backends.engine.kernels import moe_tuning
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import moe_layer_model

SHAPES = {"20b": GPT_OSS_20B, "120b": GPT_OSS_120B}
EVERY_SIZE = 1_000_000_000  # a table entry that covers every step
CHECKED_SIZES = (1, 64, 1024)  # where each variant's output is compared with the CUDA cores'
DTYPE = "bfloat16"


def expert_bytes(config: ModelConfig, value_bytes: int) -> int:
    """What one routed expert's rows weigh: MXFP4 codes, E8M0 scales and biases of fc1 and fc2."""
    h, i = config.hidden_size, config.intermediate_size
    return (2 * i * h + h * i) // 2 + (2 * i * h + h * i) // 32 + (2 * i + h) * value_bytes


def time_layer(session, device: str, config: ModelConfig, options: GraphOptions, tokens: int) -> dict[str, Any]:
    """One MoE layer step of `tokens` tokens alone on the device, inputs and output in device memory bound by
    address: µs per session run (ONNX Runtime's per-run overhead included) and the expert bytes it reads per µs."""
    import onnxruntime as ort

    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, config.hidden_size)).astype(np.float32).astype(options.numpy_type)
    logits = rng.standard_normal((tokens, config.num_experts)).astype(np.float32)
    routed = len(np.unique(np.argsort(-logits, axis=1)[:, : config.experts_per_token]))
    buffers = {
        "x": x.view(np.uint16),
        "router_logits": logits.astype(options.numpy_type).view(np.uint16),
        "y": np.zeros((tokens, config.hidden_size), np.uint16),
    }
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, device, 0) for name, array in buffers.items()}
    binding = session.io_binding()
    for name, value in values.items():
        bind = binding.bind_output if name == "y" else binding.bind_input
        bind(name, device, 0, options.onnx_type, list(buffers[name].shape), value.data_ptr())
    for _ in range(3):
        session.run_with_iobinding(binding)
    repeats = 50 if tokens < 1024 else 10
    started = time.perf_counter()
    for _ in range(repeats):
        session.run_with_iobinding(binding)
    seconds = (time.perf_counter() - started) / repeats
    read = routed * expert_bytes(config, options.numpy_type.itemsize)
    return {"us": round(seconds * 1e6, 1), "experts_routed": routed, "expert_bytes": read,
            "gb_per_s": round(read / seconds / 1e9, 1)}  # fmt: skip


def run_layer(session, x: np.ndarray, logits: np.ndarray, options: GraphOptions) -> np.ndarray:
    """One MoE layer model's y for x and router logits (host arrays in the layer's dtype), as float32."""
    import onnxruntime as ort

    storage = np.uint16 if options.numpy_type.itemsize == 2 else np.float32  # 16-bit values as raw bits
    binding = session.io_binding()
    for name, array in (("x", x), ("router_logits", logits)):
        raw = array.view(storage)
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, options.onnx_type))
    out = np.zeros((x.shape[0], x.shape[1]), storage)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, options.onnx_type))
    session.run_with_iobinding(binding)
    return out.view(options.numpy_type).astype(np.float32)


def layer_inputs(tokens: int, config: ModelConfig, options: GraphOptions) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, config.hidden_size)).astype(np.float32).astype(options.numpy_type)
    logits = rng.standard_normal((tokens, config.num_experts)).astype(np.float32).astype(options.numpy_type)
    return x, logits


def sweep_shape(
    work: Path, kernels: Path, device: str, config: ModelConfig, layer: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Every candidate and the built-in rule at every size for one model shape: µs, the fastest per size, its
    table text, and each candidate's largest difference from the CUDA cores' output (of the output's scale)."""
    model = moe_layer_model(config, layer, work, DTYPE)
    options = GraphOptions(16, DTYPE)
    us: dict[str, dict[int, float]] = {}
    differences: dict[str, float] = {}
    reference: dict[int, np.ndarray] = {}
    for variant in ("rule", *moe_tuning.CANDIDATES):
        table = None if variant == "rule" else f"{EVERY_SIZE}={variant}"
        session = kernel_session(model, kernels, device, {moe_tuning.VARIANTS_ENV: table})
        us[variant] = {size: time_layer(session, device, config, options, size)["us"] for size in moe_tuning.BUCKETS}
        outputs = {size: run_layer(session, *layer_inputs(size, config, options), options) for size in CHECKED_SIZES}
        if variant == "cores":
            reference = outputs
        if reference:
            differences[variant] = max(
                float(np.abs(outputs[s] - reference[s]).max() / max(np.abs(reference[s]).max(), 1e-30))
                for s in CHECKED_SIZES
            )
        del session
    fastest = {size: min(moe_tuning.CANDIDATES, key=lambda v: us[v][size]) for size in moe_tuning.BUCKETS}
    return {
        "experts": config.num_experts,
        "us": us,
        "fastest": fastest,
        "variants": moe_tuning.compact(fastest),
        "rule_over_fastest": {size: round(us["rule"][size] / us[fastest[size]][size], 3) for size in fastest},
        "largest_difference_from_cores": differences,
    }


def qmoe_us(work: Path, config: ModelConfig, layer: dict[str, np.ndarray]) -> dict[int, float] | dict[str, str]:
    """ONNX Runtime's contrib QMoE (fp4) on the same shape at every size: the bar the tuned table must clear."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(
            str(qmoe_layer_model(config, layer, work, DTYPE)), providers=["CUDAExecutionProvider"]
        )
        options = GraphOptions(16, DTYPE)
        return {size: time_layer(session, "cuda", config, options, size)["us"] for size in moe_tuning.BUCKETS}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}


def moe_sweep(work: Path, kernels: Path, device: str, out: Path, log) -> dict[str, Any]:
    """The sweep over SHAPES (each shape's figures saved as it ends), its table written to `out` and into the
    package's table here."""
    gpu = moe_tuning.cuda_gpu(0)
    if gpu is None:
        return {"error": "no CUDA device the driver names"}
    report: dict[str, Any] = {"device": gpu.name, "compute_capability": gpu.capability, "dtype": DTYPE}
    tables = []
    for name, config in SHAPES.items():
        layer = random_moe_layer(config, seed=1)
        shape = sweep_shape(work / f"sweep-{name}", kernels, device, config, layer)
        if name == "20b":
            shape["qmoe_us"] = qmoe_us(work / "sweep-qmoe", config, layer)
        del layer
        report[name] = shape
        log(f"sweep {name}: {shape['variants']}")
        tables.append({"device": gpu.name, "compute_capability": gpu.capability, "experts": config.num_experts,
                       "dtype": DTYPE, "variants": shape["variants"]})  # fmt: skip
    committed = json.loads(moe_tuning.TABLE.read_text())
    kept = [entry for entry in committed.get("tables", []) if entry.get("device") != gpu.name]
    table = {**committed, "tables": kept + tables}
    text = json.dumps(table, indent=2) + "\n"
    (out / "moe_tuning.json").write_text(text)
    moe_tuning.TABLE.write_text(text)
    report["table"] = tables
    return report
