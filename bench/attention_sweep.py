"""The CUDA decode attention's key split timed at every row count and context on the GPU at hand, the fastest per
row count kept as the table the engine reads at load (backends/engine/kernels/attention_tuning.py). engine_check's
`sweep` step runs it after the MoE's (bench/moe_sweep.py):

    python bench/engine_check.py --device cuda --steps sweep --out DIR

One decode step of gpt-oss's attention (64 query heads, 8 KV heads of 64, bf16; a full layer and a window layer,
as the model alternates them) for every row count of attention_tuning.ROWS and context of
attention_tuning.CONTEXTS that fit the caches (rows x context positions at most CAP_POSITIONS, each row its own
pages), under each candidate of attention_tuning.CANDIDATES (keys per split part; 0: not split) forced for every row
count through GATEWAY_ATTENTION_SPLITS; each candidate's output checked against the default's (1,024) at the
longest context of one row. Per row count, the candidate with the least time over the contexts (the geometric mean
of its times over the default's) is kept; the table text goes to DIR/attention_tuning.json (in the committed
table's format) and, on the machine that ran it, into the package's table.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from attention_layer import PAGE, attention_model
from kernel_session import kernel_session
from onnx import TensorProto

from backends.engine.config import GPT_OSS_20B, ModelConfig
from backends.engine.kernels import attention_tuning, moe_tuning
from backends.engine.rope import cos_sin

CAP_POSITIONS = 2_097_152  # the caches' positions: 2 GiB each of bf16 K and V at 8 KV heads of 64
EVERY_ROWS = 1_000_000_000  # a table entry that covers every step
DEFAULT_KEYS = 1024  # paged_attention_launch.h's kDefaultSplitKeys
REPEATS = 20


def cases(rows: tuple[int, ...], contexts: tuple[int, ...], cap: int) -> list[tuple[int, int]]:
    """The (rows, context) pairs whose positions fit the caches."""
    return [(r, c) for r in rows for c in contexts if r * c <= cap]


class DecodeStep:
    """The inputs of a decode step of `rows` rows at `context` positions each, in device memory, over caches shared
    by every case (each row its own pages); the rotary tables of the model's `reach` positions."""

    def __init__(
        self, config: ModelConfig, device: str, caches: dict[str, Any], reach: int, rows: int, context: int
    ) -> None:
        import onnxruntime as ort

        rng = np.random.default_rng(rows * 7 + context)
        heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        pages = -(-context // PAGE)
        cos, sin = cos_sin(config, reach)
        bf16 = ml_dtypes.bfloat16
        self.arrays = {
            "qkv": rng.standard_normal((rows, (heads + 2 * kv) * d), np.float32).astype(bf16).view(np.uint16),
            "positions": np.full(rows, context - 1, np.int32),
            "token_rows": np.arange(rows, dtype=np.int32),
            "page_table": np.arange(1, rows * pages + 1, dtype=np.int32).reshape(rows, pages),
            "cos_cache": cos.astype(bf16).view(np.uint16),
            "sin_cache": sin.astype(bf16).view(np.uint16),
            "sinks": rng.standard_normal(heads, np.float32).astype(bf16).view(np.uint16),
            "out": np.zeros((rows, heads * d), np.uint16),
        }
        self.values = {name: ort.OrtValue.ortvalue_from_numpy(a, device, 0) for name, a in self.arrays.items()}
        self.caches = caches
        self.device = device

    def bind(self, session):
        binding = session.io_binding()
        bf16 = TensorProto.BFLOAT16
        for name, value in self.values.items():
            element = TensorProto.INT32 if self.arrays[name].dtype == np.int32 else bf16
            shape = list(self.arrays[name].shape)
            bind = binding.bind_output if name == "out" else binding.bind_input
            bind(name, self.device, 0, element, shape, value.data_ptr())
        for name, present in (("key_cache", "present_key"), ("value_cache", "present_value")):
            cache = self.caches[name]
            binding.bind_input(name, self.device, 0, bf16, cache.shape(), cache.data_ptr())
            binding.bind_output(present, self.device, 0, bf16, cache.shape(), cache.data_ptr())
        return binding

    def time(self, session) -> tuple[float, np.ndarray]:
        """µs per run of `session` (after warming up) and its output, as float32."""
        binding = self.bind(session)
        for _ in range(3):
            session.run_with_iobinding(binding)
        out = self.values["out"].numpy().view(ml_dtypes.bfloat16).astype(np.float32)
        started = time.perf_counter()
        for _ in range(REPEATS):
            session.run_with_iobinding(binding)
        return (time.perf_counter() - started) / REPEATS * 1e6, out


def shared_caches(config: ModelConfig, device: str, positions: int) -> dict[str, Any]:
    """K and V caches of `positions` slots (and the scratch page) of random bf16 values, in device memory."""
    import onnxruntime as ort

    kv, d = config.num_key_value_heads, config.head_dim
    slots = positions + PAGE
    pattern = np.random.default_rng(0).standard_normal((min(slots, 8192), kv, d), np.float32)
    raw = np.resize(pattern.astype(ml_dtypes.bfloat16).view(np.uint16), (slots, kv, d))
    return {name: ort.OrtValue.ortvalue_from_numpy(raw, device, 0) for name in ("key_cache", "value_cache")}


def fastest_keys(us: dict[int, dict[tuple[int, int], float]], pairs: list[tuple[int, int]]) -> dict[int, int]:
    """Per row count, the candidate whose times over its contexts have the least geometric mean of their ratio to
    the default's."""
    chosen = {}
    for rows in sorted({r for r, _ in pairs}):
        mine = [p for p in pairs if p[0] == rows]

        def cost(keys: int, mine: list[tuple[int, int]] = mine) -> float:
            return sum(math.log(us[keys][p] / us[DEFAULT_KEYS][p]) for p in mine) / len(mine)

        chosen[rows] = min(attention_tuning.CANDIDATES, key=cost)
    return chosen


def attention_sweep(
    work: Path, kernels: Path, device: str, out: Path, log, config: ModelConfig = GPT_OSS_20B
) -> dict[str, Any]:
    """The sweep (see the module's docstring), its table written to `out` and into the package's table here."""
    gpu = moe_tuning.cuda_gpu(0)
    if gpu is None:
        return {"error": "no CUDA device the driver names"}
    pairs = cases(attention_tuning.ROWS, attention_tuning.CONTEXTS, CAP_POSITIONS)
    largest = max(c for _, c in pairs)
    work.mkdir(parents=True, exist_ok=True)
    models = {}
    for kind, window in (("full", 0), ("window", config.sliding_window)):
        models[kind] = work / f"attention-sweep-{kind}.onnx"
        models[kind].write_bytes(attention_model(config, window, TensorProto.BFLOAT16, largest))
    caches = shared_caches(config, device, max(r * c for r, c in pairs))
    steps = {pair: DecodeStep(config, device, caches, largest, *pair) for pair in pairs}
    us: dict[int, dict[tuple[int, int], float]] = {}
    differences: dict[int, float] = {}
    reference = None
    for keys in (DEFAULT_KEYS, *(k for k in attention_tuning.CANDIDATES if k != DEFAULT_KEYS)):
        env = {attention_tuning.SPLITS_ENV: f"{EVERY_ROWS}={keys}"}
        sessions = {kind: kernel_session(model, kernels, device, env) for kind, model in models.items()}
        us[keys] = {pair: round(sum(step.time(s)[0] for s in sessions.values()), 2) for pair, step in steps.items()}
        # the output on caches of their own (the timed steps write into each other's positions): one row at the
        # longest context, the same inputs for every candidate
        output = DecodeStep(config, device, shared_caches(config, device, largest), largest, 1, largest)
        output = output.time(sessions["full"])[1]
        reference = output if reference is None else reference
        differences[keys] = float(np.abs(output - reference).max() / max(np.abs(reference).max(), 1e-30))
        del sessions
        log(f"attention sweep: {keys} keys a part timed")
    chosen = fastest_keys(us, pairs)
    text = moe_tuning.compact({rows: str(keys) for rows, keys in chosen.items()})
    entry = {"device": gpu.name, "compute_capability": gpu.capability, "dtype": "bfloat16", "splits": text}
    committed = json.loads(attention_tuning.TABLE.read_text())
    kept = [e for e in committed.get("tables", []) if e.get("device") != gpu.name]
    table_text = json.dumps({**committed, "tables": [*kept, entry]}, indent=2) + "\n"
    (out / "attention_tuning.json").write_text(table_text)
    attention_tuning.TABLE.write_text(table_text)
    log(f"attention sweep: {text}")
    return {
        "device": gpu.name,
        "compute_capability": gpu.capability,
        "splits": text,
        "fastest": {str(rows): keys for rows, keys in chosen.items()},
        "us": {str(keys): {f"{r}x{c}": t for (r, c), t in times.items()} for keys, times in us.items()},
        "largest_difference_from_default": {str(k): d for k, d in differences.items()},
        "table": entry,
    }
