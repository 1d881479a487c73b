"""gptoss.engine::PagedAttention against a float64 reference at gpt-oss's attention width (64 query heads, 8 KV
heads of 64): the model-local function, the compiled CPU kernel, and the CUDA kernel under the host warp
emulation, over ragged steps (a prefill chunk beside decode rows), pages scattered through the pool, the
128-token window crossing page borders, and the caches updated in place."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import onnxruntime as ort
import pytest
from emulated_kernels import compile_emulated
from onnx import TensorProto
from paths import ROOT

from backends.engine.config import ModelConfig
from backends.engine.kernels import build
from backends.engine.rope import cos_sin

sys.path.insert(0, str(ROOT / "bench"))
from attention_layer import Case, attention_model, attention_timing
from engine_check_report import attention_lines

CONFIG = ModelConfig(num_hidden_layers=2)  # gpt-oss's heads: 64 query, 8 KV, 64 wide; window 128
PAGE = 16
POSITIONS = 512
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
NUMPY_TYPES = {"float32": np.float32, "float16": np.float16}


def _model(window_layer: bool, dtype: str) -> bytes:
    return attention_model(CONFIG, CONFIG.sliding_window if window_layer else 0, ONNX_TYPES[dtype], POSITIONS)


class Reference:
    """Float64 attention over each row's positions, kept contiguously (keys rotated as written)."""

    def __init__(self, rows: int) -> None:
        cos, sin = cos_sin(CONFIG, POSITIONS)
        self.cos, self.sin = cos.astype(np.float64), sin.astype(np.float64)
        self.keys = [dict() for _ in range(rows)]
        self.values = [dict() for _ in range(rows)]

    def _rotate(self, x: np.ndarray, position: int) -> np.ndarray:
        half = x.shape[-1] // 2
        c, s = self.cos[position], self.sin[position]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def step(self, qkv, positions, rows, sinks, window: int) -> np.ndarray:
        c = CONFIG
        h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        qkv = qkv.astype(np.float64)
        for t, (row, position) in enumerate(zip(rows, positions, strict=True)):
            k = qkv[t, h * d : (h + kv) * d].reshape(kv, d)
            self.keys[row][position] = self._rotate(k, position)
            self.values[row][position] = qkv[t, (h + kv) * d :].reshape(kv, d)
        out = np.zeros((len(rows), h * d))
        for t, (row, position) in enumerate(zip(rows, positions, strict=True)):
            q = self._rotate(qkv[t, : h * d].reshape(h, d), position) / np.sqrt(d)
            first = max(0, position - window + 1) if window else 0
            seen = range(first, position + 1)
            keys = np.stack([self.keys[row][j] for j in seen])  # [L, kv, d]
            values = np.stack([self.values[row][j] for j in seen])
            for head in range(h):
                group = head // (h // kv)
                scores = keys[:, group] @ q[head]
                top = max(scores.max(), sinks[head])
                weights = np.exp(scores - top)
                total = weights.sum() + np.exp(sinks[head] - top)
                out[t, head * d : (head + 1) * d] = weights @ values[:, group] / total
        return out


def _steps() -> list[tuple[list[int], list[int]]]:
    """(rows, positions) per step: row 0 prefills 150 tokens in chunks, rows 1 and 2 start later and decode beside
    it; every row crosses page borders and row 0 goes past the window."""
    steps = [([1] * 40, list(range(40))), ([0] * 100 + [1], [*range(100), 40])]
    steps.append(([0] * 50 + [1] + [2] * 7, [*range(100, 150), 41, *range(7)]))
    for offset in range(3):
        steps.append(([0, 1, 2], [150 + offset, 42 + offset, 7 + offset]))
    return steps


def _representable(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `values` rounded to `dtype` (bfloat16: held as the float32 values it can represent)."""
    if dtype == "bfloat16":
        return _from_bfloat16(_bfloat16_bits(values))
    return values.astype(NUMPY_TYPES[dtype])


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _run_all(runner, dtype: str, window: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The outputs of each step from `runner` and the reference's, on the same random inputs."""
    rng = np.random.default_rng(5)
    c = CONFIG
    width = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    rows = 3
    pages_per_row = POSITIONS // PAGE
    pool = rng.permutation(np.arange(1, rows * pages_per_row + 1)).astype(np.int32)  # page 0: scratch
    table = pool.reshape(rows, pages_per_row)
    sinks = rng.standard_normal(c.num_attention_heads).astype(np.float32)
    reference = Reference(rows)
    got, expected = [], []
    for step_rows, positions in _steps():
        qkv = _representable(rng.standard_normal((len(step_rows), width)).astype(np.float32), dtype)
        got.append(runner(qkv, np.array(positions, np.int32), np.array(step_rows, np.int32), table, sinks))
        expected.append(reference.step(qkv, positions, step_rows, sinks.astype(np.float64), window))
    return got, expected


class Session:
    """One PagedAttention node in a session, its caches bound in place across steps."""

    def __init__(self, window_layer: bool, dtype: str, kernels: bool) -> None:
        options = ort.SessionOptions()
        if kernels:
            options.register_custom_ops_library(str(build.build_library()))
        self.session = ort.InferenceSession(_model(window_layer, dtype), options, providers=["CPUExecutionProvider"])
        self.dtype = dtype
        c = CONFIG
        slots = (3 * POSITIONS // PAGE + 1) * PAGE
        self.caches = [np.zeros((slots, c.num_key_value_heads, c.head_dim), NUMPY_TYPES[dtype]) for _ in range(2)]
        cos, sin = cos_sin(c, POSITIONS)
        self.tables = cos.astype(NUMPY_TYPES[dtype]), sin.astype(NUMPY_TYPES[dtype])

    def __call__(self, qkv, positions, rows, table, sinks) -> np.ndarray:
        onnx_type = ONNX_TYPES[self.dtype]
        binding = self.session.io_binding()
        binding.bind_output("out", "cpu")  # first: get_outputs() follows the order of binding
        for name, cache in zip(("key_cache", "value_cache"), self.caches, strict=True):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(cache, onnx_type))
        for name, cache in zip(("present_key", "present_value"), self.caches, strict=True):
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(cache, onnx_type))
        inputs = {
            "qkv": qkv,
            "positions": positions,
            "token_rows": rows,
            "page_table": table,
            "cos_cache": self.tables[0],
            "sin_cache": self.tables[1],
            "sinks": sinks.astype(NUMPY_TYPES[self.dtype]),
        }
        for name, value in inputs.items():
            binding.bind_cpu_input(name, value)
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy().astype(np.float64)


TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2e-2}


@pytest.mark.parametrize("window_layer", [True, False], ids=["window", "full"])
@pytest.mark.parametrize(("dtype", "kernels"), [("float32", False), ("float32", True), ("float16", True)])
def test_matches_reference(window_layer: bool, dtype: str, kernels: bool) -> None:
    window = CONFIG.sliding_window if window_layer else 0
    got, expected = _run_all(Session(window_layer, dtype, kernels), dtype, window)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        error = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert error < TOLERANCE[dtype], f"step {step}: relative error {error}"


def test_the_kernel_refuses_a_page_outside_the_cache() -> None:
    session = Session(False, "float32", kernels=True)
    c = CONFIG
    qkv = np.zeros((1, (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim), np.float32)
    table = np.full((1, POSITIONS // PAGE), 10_000, np.int32)
    with pytest.raises(Exception, match="outside the cache"):
        session(qkv, np.array([3], np.int32), np.array([0], np.int32), table, np.zeros(c.num_attention_heads))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    directory = tmp_path_factory.mktemp("attention_emulation")
    return compile_emulated(
        build.ATTENTION_CUDA_SOURCE, "attention_emulation_driver.cc", "gptoss_emulated_attention", directory, "-O1"
    )


EMULATED_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}  # gptoss::Dtype


def _storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """float `values` as the kernel reads `dtype`: float32, float16, or bfloat16's bits."""
    if dtype == "bfloat16":
        return _bfloat16_bits(values)
    return np.ascontiguousarray(values, NUMPY_TYPES[dtype])


def _emulated_runner(emulated: ctypes.CDLL, dtype: str, window: int, split_keys: int, tensor_cores: bool):
    """A `_run_all` runner over the emulated CUDA kernel in `dtype`, its caches kept across steps."""
    c = CONFIG
    slots = (3 * POSITIONS // PAGE + 1) * PAGE
    caches = [_storage(np.zeros((slots, c.num_key_value_heads, c.head_dim), np.float32), dtype) for _ in range(2)]
    cos, sin = (_storage(table, dtype) for table in cos_sin(c, POSITIONS))

    def run(qkv, positions, rows, table, sinks) -> np.ndarray:
        out = _storage(np.zeros((len(rows), c.num_attention_heads * c.head_dim), np.float32), dtype)
        arrays = [_storage(qkv, dtype), *caches, positions, rows, table, cos, sin, _storage(sinks, dtype), out]
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
        sizes = [len(rows), table.shape[0], table.shape[1], slots, POSITIONS, window, PAGE, split_keys]
        error = emulated.gptoss_emulated_attention(
            *pointers,
            *(ctypes.c_int64(v) for v in sizes),
            ctypes.c_int(EMULATED_DTYPES[dtype]),
            ctypes.c_int(tensor_cores),
        )
        assert error is None, error.decode()
        return (_from_bfloat16(out) if dtype == "bfloat16" else out).astype(np.float64)

    return run


def _errors(got: list[np.ndarray], expected: list[np.ndarray]) -> list[float]:
    """Each step's largest difference relative to its largest output (at least 1)."""
    return [float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) for a, b in zip(got, expected, strict=True)]


@pytest.mark.parametrize("split_keys", [0, 64], ids=["whole", "split"])
@pytest.mark.parametrize("window_layer", [True, False], ids=["window", "full"])
def test_cuda_kernel_under_emulation(emulated: ctypes.CDLL, window_layer: bool, split_keys: int) -> None:
    """Decode steps read each token's keys in one block, or (split) in parts of about 64 merged after, as long
    contexts are on a GPU; prefill steps in tiles of 8 tokens."""
    window = CONFIG.sliding_window if window_layer else 0
    got, expected = _run_all(_emulated_runner(emulated, "float32", window, split_keys, True), "float32", window)
    for step, error in enumerate(_errors(got, expected)):
        assert error < TOLERANCE["float32"], f"step {step}: relative error {error}"


@pytest.mark.parametrize("split_keys", [0, 64], ids=["whole", "split"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window_layer", [True, False], ids=["window", "full"])
def test_tensor_cores_under_emulation(emulated: ctypes.CDLL, window_layer: bool, dtype: str, split_keys: int) -> None:
    """In 16-bit dtypes, rows running several tokens (a 40-token prefill, a 100-token chunk beside a decode row,
    a ragged step of three rows) attend on the tensor cores (AttendMma's tiles of 16 tokens and 64 keys), and
    decode steps too (DecodeMma: a token's keys whole, or split in parts merged after), as close to the float64
    reference as the CUDA-core kernels are, within the dtype's tolerance."""
    window = CONFIG.sliding_window if window_layer else 0
    errors = {}
    for tensor_cores in (True, False):
        runner = _emulated_runner(emulated, dtype, window, split_keys, tensor_cores)
        errors[tensor_cores] = _errors(*_run_all(runner, dtype, window))
    for step, (mma, tiles) in enumerate(zip(errors[True], errors[False], strict=True)):
        assert mma < TOLERANCE[dtype], f"step {step}: relative error {mma} on the tensor cores ({tiles} without)"
        assert mma < 2 * tiles + TOLERANCE[dtype] / 4, f"step {step}: {mma} on the tensor cores, {tiles} without"


def test_the_attention_bench_times_both_prefill_paths_and_reports_them(tmp_path) -> None:
    """bench/attention_layer.py end to end on the CPU kernel (where both settings run the same code): every case
    timed both ways with equal outputs, and engine_check's docs section renders a row per case."""
    cases = (
        Case("prefill_40", 40, 0, 0),
        Case("chunk_24_at_150_window", 24, 150, 128),
        Case("decode_3_at_70", 3, 70, 0, decode=True),
    )
    report = attention_timing(CONFIG, tmp_path, build.build_library(), "cpu", cases)
    assert list(report) == [case.name for case in cases]
    for row in report.values():
        assert row["us_tensor_cores"] > 0 and row["us_cuda_cores"] > 0
        assert row["max_diff_relative"] == 0.0  # the CPU kernel has one path
    assert cases[1].keys_seen() == 24 * 128 and cases[0].keys_seen() == 40 * 41 // 2 and cases[2].keys_seen() == 3 * 71
    lines = attention_lines(report)
    assert sum(line.startswith("| prefill 40 |") for line in lines) == 1
