"""One PagedAttention node at gpt-oss's heads on a device, timed alone (bench/engine_check.py's `attention` step):
prefill chunks and decode steps on the tensor cores (AttendMma, DecodeMma) against the CUDA-core kernels
(AttendTiles, Attend: GATEWAY_ATTENTION_MMA=0) in the same run, and their outputs against each other. The caches
hold random keys and values at every position a case reads (attention's work does not depend on how they got
there)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from kernel_session import kernel_session
from onnx import TensorProto, helper

from backends.engine.attention import INPUTS, attention_attributes, paged_attention_function
from backends.engine.config import ModelConfig
from backends.engine.opsets import ENGINE_DOMAIN, IR_VERSION, OPSET
from backends.engine.rope import cos_sin

ATTENTION_MMA_ENV = "GATEWAY_ATTENTION_MMA"  # read when a session makes its kernel: "0", the CUDA cores
PAGE = 16
PRESENT = {"key_cache": "present_key", "value_cache": "present_value"}  # the caches' outputs, bound in place
CACHE_PATTERN = 8192  # random slots repeated through a larger cache (drawing 256 rows' 2k positions takes seconds)


@dataclass(frozen=True)
class Case:
    """A prefill step (one row's `tokens` consecutive tokens from position `start`) or a decode step (`tokens`
    rows' one token each at `start`); `window`: the layer's (0: a full layer)."""

    name: str
    tokens: int
    start: int
    window: int
    decode: bool = False

    @property
    def rows(self) -> int:
        return self.tokens if self.decode else 1

    @property
    def positions(self) -> int:
        """Positions a row reaches."""
        return self.start + (1 if self.decode else self.tokens)

    def keys_seen(self) -> int:
        """Query-key pairs the step weighs, per query head."""
        last = self.start + (0 if self.decode else self.tokens - 1)
        seen = sum(min(p + 1, self.window or p + 1) for p in range(self.start, last + 1))
        return seen * (self.tokens if self.decode else 1)


CASES = (
    Case("prefill_8192_full", 8192, 0, 0),
    Case("prefill_8192_window", 8192, 0, 128),
    Case("chunk_2048_at_129024_full", 2048, 129_024, 0),
    Case("decode_64_rows_at_2048_full", 64, 2048, 0, decode=True),
    Case("decode_256_rows_at_2048_full", 256, 2048, 0, decode=True),
    Case("decode_1_row_at_8192_full", 1, 8192, 0, decode=True),
)


def attention_model(config: ModelConfig, window: int, onnx_type: int, max_positions: int) -> bytes:
    """A model of one PagedAttention node (the inputs and outputs its op names; present_* bound in place), on a
    window layer of `config` (`window` > 0) or a full one."""
    layer = next(i for i in range(config.num_hidden_layers) if config.is_sliding(i) == (window > 0))
    node = helper.make_node(
        "PagedAttention",
        INPUTS,
        ["out", "present_key", "present_value"],
        domain=ENGINE_DOMAIN,
        **attention_attributes(config, layer, PAGE),
    )
    width = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    cache = ["slots", config.num_key_value_heads, config.head_dim]
    rotary = [max_positions, config.head_dim // 2]
    int32 = TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("qkv", onnx_type, ["tokens", width]),
        helper.make_tensor_value_info("key_cache", onnx_type, cache),
        helper.make_tensor_value_info("value_cache", onnx_type, cache),
        helper.make_tensor_value_info("positions", int32, ["tokens"]),
        helper.make_tensor_value_info("token_rows", int32, ["tokens"]),
        helper.make_tensor_value_info("page_table", int32, ["rows", "pages"]),
        helper.make_tensor_value_info("cos_cache", onnx_type, rotary),
        helper.make_tensor_value_info("sin_cache", onnx_type, rotary),
        helper.make_tensor_value_info("sinks", onnx_type, [config.num_attention_heads]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", onnx_type, ["tokens", config.num_attention_heads * config.head_dim]),
        helper.make_tensor_value_info("present_key", onnx_type, cache),
        helper.make_tensor_value_info("present_value", onnx_type, cache),
    ]
    graph = helper.make_graph([node], "paged_attention", inputs, outputs)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(ENGINE_DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[paged_attention_function()])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


def attention_session(model: Path, kernels: Path, device: str, tensor_cores: bool):
    """A session of `model` with our kernels; `tensor_cores` False: attention on the CUDA cores."""
    return kernel_session(model, kernels, device, {ATTENTION_MMA_ENV: 1 if tensor_cores else 0})


def case_arrays(config: ModelConfig, case: Case, numpy_type: type) -> dict[str, np.ndarray]:
    """The inputs of `case` (16-bit values as raw bits) and a zero output, on the host."""
    rng = np.random.default_rng(case.tokens + case.start)
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    step_tokens = case.tokens
    pages = (case.positions + PAGE - 1) // PAGE
    slots = (case.rows * pages + 1) * PAGE  # page 0: scratch

    def values(shape: tuple[int, ...], spread: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape, np.float32) * spread).astype(numpy_type).view(np.uint16)

    cos, sin = cos_sin(config, case.positions)
    if not case.decode:
        positions = np.arange(case.start, case.start + case.tokens, dtype=np.int32)
        token_rows = np.zeros(step_tokens, np.int32)
    else:
        positions = np.full(step_tokens, case.start, np.int32)
        token_rows = np.arange(step_tokens, dtype=np.int32)
    return {
        "qkv": values((step_tokens, (heads + 2 * kv) * d)),
        "key_cache": np.resize(values((min(slots, CACHE_PATTERN), kv, d)), (slots, kv, d)),
        "value_cache": np.resize(values((min(slots, CACHE_PATTERN), kv, d)), (slots, kv, d)),
        "positions": positions,
        "token_rows": token_rows,
        "page_table": np.arange(1, case.rows * pages + 1, dtype=np.int32).reshape(case.rows, pages),
        "cos_cache": cos.astype(numpy_type).view(np.uint16),
        "sin_cache": sin.astype(numpy_type).view(np.uint16),
        "sinks": values((heads,)),
        "out": np.zeros((step_tokens, heads * d), np.uint16),
    }


def run_case(session, arrays: dict[str, np.ndarray], device: str, onnx_type: int, repeats: int):
    """µs per run of `session` on `arrays` (in device memory, the caches bound in place) and its output."""
    import onnxruntime as ort

    on_device = {name: ort.OrtValue.ortvalue_from_numpy(array, device, 0) for name, array in arrays.items()}
    binding = session.io_binding()
    for name, value in on_device.items():
        element = TensorProto.INT32 if arrays[name].dtype == np.int32 else onnx_type
        shape = list(arrays[name].shape)
        if name == "out":
            binding.bind_output("out", device, 0, element, shape, value.data_ptr())
            continue
        binding.bind_input(name, device, 0, element, shape, value.data_ptr())
        if name in PRESENT:
            binding.bind_output(PRESENT[name], device, 0, element, shape, value.data_ptr())
    session.run_with_iobinding(binding)  # warm-up (and the output compared)
    out = on_device["out"].numpy().copy()
    started = time.perf_counter()
    for _ in range(repeats):
        session.run_with_iobinding(binding)
    return (time.perf_counter() - started) / repeats * 1e6, out


def attention_timing(
    config: ModelConfig, work: Path, kernels: Path, device: str, cases: tuple[Case, ...] = CASES
) -> dict[str, Any]:
    """Each case on the tensor cores and on the CUDA cores (bf16): µs per step, the multiply-adds' rate on the
    tensor cores, the KV bytes a decode step must read per second there, and the outputs' largest difference
    relative to the largest output."""
    onnx_type, numpy_type = TensorProto.BFLOAT16, ml_dtypes.bfloat16
    report: dict[str, Any] = {}
    for case in cases:
        model = work / f"attention-{case.name}.onnx"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_bytes(attention_model(config, case.window, onnx_type, case.positions))
        arrays = case_arrays(config, case, numpy_type)
        results = {}
        for tensor_cores in (True, False):
            session = attention_session(model, kernels, device, tensor_cores)
            repeats = 3 if not tensor_cores and not case.decode else 10
            results[tensor_cores] = run_case(session, arrays, device, onnx_type, repeats)
            del session
        (mma_us, mma_out), (cuda_us, cuda_out) = results[True], results[False]
        as_float = [out.view(numpy_type).astype(np.float32) for out in (mma_out, cuda_out)]
        flops = 4 * config.num_attention_heads * config.head_dim * case.keys_seen()
        kv_bytes = case.keys_seen() * config.num_key_value_heads * config.head_dim * 2 * 2  # keys and values, bf16
        read_rate = round(kv_bytes / mma_us / 1e3, 1) if case.decode else None  # a prefill re-reads its tiles
        report[case.name] = {
            "us_tensor_cores": round(mma_us, 1),
            "us_cuda_cores": round(cuda_us, 1),
            "speedup": round(cuda_us / mma_us, 2),
            "tflops_tensor_cores": round(flops / mma_us / 1e6, 1),
            "kv_gb_per_s_tensor_cores": read_rate,
            "max_diff_relative": float(np.abs(as_float[0] - as_float[1]).max() / max(np.abs(as_float[1]).max(), 1e-6)),
        }
    return report
