"""One ONNX Runtime session over the decoder graph, on the CPU or a CUDA device, with the KV page pools of
every layer preallocated and bound in place through IO binding (no per-step copies of the cache). On CUDA
the pools and logits live on the device. A step runs any rows at once (decode rows and prefill chunks,
each row's tokens at its positions through its page tables); each row's next-token logits land in its row
of one logits buffer, where the SampleTokens op (sampling_session.py, with the compiled kernels) chooses
the next tokens on the same device: only token ids and asked-for logprobs come back; without the kernels
the NumPy sampler reads the rows on the host. With `cuda_graph`, a decode step is padded to a bucket of
rows (1, 2, 4, ... up to the largest batch), each bucket captured once as a CUDA graph and replayed: its
tokens, positions and page tables sit in fixed device buffers of full width, updated in place; padding
rows write to the scratch page."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .attention import FUNCTION_GATHER_BUDGET
from .config import ModelConfig
from .graph import DTYPES, Dtype, kv_names
from .host_costs import HostCosts
from .page_pool import SCRATCH, PageTable
from .sampler import Sampled, SamplingRows, sample_rows
from .sampling_session import SamplingSession

Device = Literal["auto", "cpu", "cuda"]
CUDA = "CUDAExecutionProvider"


class EngineDeviceError(RuntimeError):
    """The requested device cannot run the engine; the message says why."""


ORT_DEFAULT_SEVERITY = 2  # warnings and above: ONNX Runtime's own default


@functools.cache
def cuda_unavailable_reason(device_id: int = 0) -> str | None:
    """None when onnxruntime's CUDA provider runs a node on `device_id`; else why it does not."""
    if CUDA not in ort.get_available_providers():
        return f"this onnxruntime ({ort.__version__}) has no CUDA provider: install onnxruntime-gpu"
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        quiet = io.StringIO()  # it prints each library it cannot find; the probe below says what matters
        with contextlib.suppress(Exception), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            preload()  # CUDA and cuDNN from the nvidia-* wheels, when they are installed
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])],
        "probe",
        [x],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 4
    ort.set_default_logger_severity(4)  # a machine without CUDA is an answer here, not an error to print
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=[(CUDA, {"device_id": device_id}), "CPUExecutionProvider"]
        )
        session.run(None, {"x": np.zeros(1, np.float32)})
    except Exception as exc:
        return f"the CUDA provider failed on device {device_id}: {exc}"
    finally:
        ort.set_default_logger_severity(ORT_DEFAULT_SEVERITY)
    if session.get_providers()[0] != CUDA:
        return f"the CUDA provider did not load for device {device_id} (no GPU, or CUDA 13 / cuDNN 9 libraries missing)"
    return None


def resolve_device(device: Device, device_id: int = 0) -> Literal["cpu", "cuda"]:
    """`auto`: CUDA when its provider loads here, else the CPU; `cuda`: CUDA or EngineDeviceError."""
    if device == "cpu":
        return "cpu"
    reason = cuda_unavailable_reason(device_id)
    if reason is None:
        return "cuda"
    if device == "cuda":
        raise EngineDeviceError(f"device cuda was asked for, but {reason}")
    return "cpu"


def _host_view(address: int, size: int) -> np.ndarray:
    """A writable byte view of host memory that an OrtValue owns."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime the CUDA provider loaded (its soname first: the process holds it already)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(name)
    raise EngineDeviceError("the CUDA runtime library (libcudart) is not loadable to copy KV between pages")


DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice


def copy_device_rows(target: int, source: int, pitch: int, width: int, rows: int) -> None:
    """`rows` rows of `width` bytes, `pitch` apart, from device address `source` to `target`; done on return."""
    cudart = _cudart()
    status = cudart.cudaMemcpy2D(
        ctypes.c_void_p(target),
        ctypes.c_size_t(pitch),
        ctypes.c_void_p(source),
        ctypes.c_size_t(pitch),
        ctypes.c_size_t(width),
        ctypes.c_size_t(rows),
        ctypes.c_int(DEVICE_TO_DEVICE),
    )
    if status == 0:
        status = cudart.cudaDeviceSynchronize()  # a device-to-device copy may return before it is done
    if status != 0:
        raise EngineDeviceError(f"copying KV between pages failed (CUDA error {status})")


def graph_page_size(model_path: str) -> int:
    """The page size a decoder graph's attention was built for (read from the graph, not its weights)."""
    model = onnx.load(model_path, load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "PagedAttention":
            return next(helper.get_attribute_value(a) for a in node.attribute if a.name == "page_size")
    raise ValueError(f"{model_path} has no PagedAttention node: it was built by another version")


def bucket(rows: int, largest: int) -> int:
    """The CUDA-graph bucket (1, 2, 4, ... up to `largest`) a decode step of `rows` rows is padded to."""
    return min(largest, 1 << (rows - 1).bit_length())


@dataclass(slots=True)
class StepRows:
    """A step's rows: each row's tokens (consecutive positions from `starts[i]`) and its page table."""

    tokens: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    tables: list[PageTable] = field(default_factory=list)
    unread: int = 0  # rows at the end whose logits nobody reads (a prompt's piece before its last)

    def add(self, tokens: list[int], start: int, table: PageTable, logits: bool = True) -> int:
        """A row; its index (and its logits row once the step ran). Rows without `logits` come after all others."""
        if logits and self.unread:
            raise ValueError("rows without logits come last")
        self.tokens.append(tokens)
        self.starts.append(start)
        self.tables.append(table)
        self.unread += not logits
        return len(self.tokens) - 1


class DecoderRuntime:
    """`run` advances rows of sequences by their tokens, each row's logits row then its next token's; `sample`
    chooses the rows' next tokens from those logits (`logits` copies them to the host instead)."""

    def __init__(
        self,
        model_path: str,
        config: ModelConfig,
        max_rows: int,
        max_positions: int,
        full_pages: int,
        window_pages: int,
        page_size: int,
        threads: int = 0,
        kernels: Path | None = None,
        device: Literal["cpu", "cuda"] = "cpu",
        device_id: int = 0,
        dtype: Dtype = "float32",
        cuda_graph: bool = False,
        buckets: bool | None = None,
        spinning: bool = True,
    ) -> None:
        """`max_rows`: the most rows a step runs (decode rows plus a prefill chunk); `full_pages`, `window_pages`:
        the pools' pages of `page_size` positions (page 0 of each is scratch). `kernels`: a compiled kernel
        library; its ops replace the graph's portable realizations and its SampleTokens samples on this
        runtime's device. `dtype`: the graph's activation and KV dtype. `buckets`: decode steps padded to the
        bucket sizes, their inputs in fixed buffers (None: with CUDA graphs, which replay them). `spinning`: the
        decoder's intra-op threads spin awaiting work between operators (False: they sleep; the sampler's sleep)."""
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        if kernels is not None:
            options.register_custom_ops_library(str(kernels))
        # the sampler's session: its inputs come from the host each step, so it is never replayed as a CUDA graph
        sampler_providers: list = ["CPUExecutionProvider"]
        providers: list = ["CPUExecutionProvider"]
        if device == "cuda":
            cuda_options = {
                "device_id": device_id,
                "arena_extend_strategy": "kSameAsRequested",  # the arena grows by what is asked, not doubling
            }
            sampler_providers = [(CUDA, cuda_options), "CPUExecutionProvider"]
            graphs = {**cuda_options, "enable_cuda_graph": "1" if cuda_graph else "0"}
            providers = [(CUDA, graphs), "CPUExecutionProvider"]
        built_for = graph_page_size(model_path)
        if built_for != page_size:
            raise ValueError(f"{model_path} was built for pages of {built_for} positions, not {page_size}")
        self.session = ort.InferenceSession(model_path, options, providers=providers)
        if device == "cuda" and self.session.get_providers()[0] != CUDA:
            raise EngineDeviceError("the CUDA provider did not load for the decoder graph")
        self.config = config
        self.max_rows = max_rows
        self.max_positions = max_positions
        self.page_size = page_size
        self.pages = {"full": full_pages, "window": window_pages}
        self.device = device
        self.cuda_graph = cuda_graph and device == "cuda"
        self.buckets = self.cuda_graph if buckets is None else buckets
        self.gather_budget = None if kernels is not None else FUNCTION_GATHER_BUDGET
        self._place = ("cuda", device_id) if device == "cuda" else ("cpu", 0)
        self._kv_type = DTYPES[dtype][0]
        self._kv_itemsize = DTYPES[dtype][1].itemsize
        self._row_bytes = config.num_key_value_heads * config.head_dim * self._kv_itemsize  # one position
        self._caches: list[tuple[str, ort.OrtValue]] = []  # per layer K, V: (pool kind, buffer)
        for layer in range(config.num_hidden_layers):
            kind = "window" if config.is_sliding(layer) else "full"
            shape = (self.pages[kind] * page_size, config.num_key_value_heads, config.head_dim)
            self._caches += [(kind, self._zeros(shape, DTYPES[dtype][1])) for _ in range(2)]
        self._logits = self._zeros((max_rows, config.vocab_size), np.dtype(np.float32))
        self.costs = HostCosts()  # what the host spends around the runs (host_costs.py)
        self._sampler = (
            None
            if kernels is None
            else SamplingSession(kernels, sampler_providers, self._place, self._logits, threads, costs=self.costs)
        )
        self._binding = self._bound()
        self._graph_bindings: dict[int, tuple[ort.IOBinding, dict[str, ort.OrtValue]]] = {}
        self._graph_run_options: dict[int, ort.RunOptions] = {}
        self._last_rows = 0  # rows the last step wrote logits for

    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        """A zeroed buffer in this runtime's memory, bound by address with its real type (host memory is
        shared with a NumPy array; device memory is copied from zero pages: a fresh allocation holds
        whatever was there, and attention must not meet it)."""
        storage = np.zeros(shape, np.uint16 if dtype.itemsize == 2 else dtype)  # zero bits: zero in any float
        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(storage, helper.np_dtype_to_tensor_dtype(dtype))
        return ort.OrtValue.ortvalue_from_numpy(storage, *self._place)

    def _bound(self) -> ort.IOBinding:
        """An IO binding with every layer's pools bound in place, as input and output."""
        binding = self.session.io_binding()
        place, device_id = self._place
        for layer in range(self.config.num_hidden_layers):
            past_k, past_v, present_k, present_v = kv_names(layer)
            for (past, present), (_, buffer) in zip(
                ((past_k, present_k), (past_v, present_v)), self._caches[2 * layer : 2 * layer + 2], strict=True
            ):
                shape = buffer.shape()
                binding.bind_input(past, place, device_id, self._kv_type, shape, buffer.data_ptr())
                binding.bind_output(present, place, device_id, self._kv_type, shape, buffer.data_ptr())
        return binding

    @property
    def kv_bytes(self) -> int:
        return sum(buffer.tensor_size_in_bytes() for _, buffer in self._caches)

    def copy_page(self, kind: str, source: int, target: int, positions: int) -> None:
        """Copy the first `positions` positions of page `source` to page `target` in every layer of pool `kind`."""
        if source == target:  # the copy's source was taken back and given as its target: the rows are in place
            return
        offset = self.page_size * self._row_bytes
        width = positions * self._row_bytes
        for pool, buffer in self._caches:
            if pool != kind:
                continue
            base = buffer.data_ptr()
            if self.device == "cpu":
                storage = _host_view(base, buffer.tensor_size_in_bytes())
                storage[target * offset : target * offset + width] = storage[source * offset : source * offset + width]
            else:
                copy_device_rows(base + target * offset, base + source * offset, offset, width, 1)

    def chunk_limit(self, context: int) -> int | None:
        """The most tokens one step may run for a row reaching `context` positions (None: no limit): the portable
        attention gathers every token's context."""
        return None if self.gather_budget is None else max(1, self.gather_budget // max(1, context))

    @property
    def samples_on_device(self) -> bool:
        """Whether the SampleTokens kernels choose the tokens (else the NumPy sampler, on the host)."""
        return self._sampler is not None

    def sample(self, rows: SamplingRows) -> Sampled:
        """Next tokens from the logits rows the last step left (`rows.rows`: their indices)."""
        if self._sampler is not None:
            return self._sampler.sample(rows)
        indices = sorted(set(rows.rows.tolist()))
        local = np.searchsorted(np.array(indices), rows.rows).astype(np.int32)  # each row's index among `indices`
        return sample_rows(self.logits(indices), dataclasses.replace(rows, rows=local))

    def logits(self, rows: list[int]) -> np.ndarray:
        """A host copy of these logits rows, as the last step left them."""
        if not all(0 <= row < self._last_rows for row in rows):
            raise ValueError(f"rows {rows} are not all among the last step's {self._last_rows}")
        vocab = self.config.vocab_size
        if self.device == "cpu":
            view = np.ctypeslib.as_array(
                (ctypes.c_float * (self.max_rows * vocab)).from_address(self._logits.data_ptr())
            )
            rows_read = view.reshape(self.max_rows, vocab)[rows]  # fancy indexing copies
        else:
            rows_read = self._logits.numpy()[rows]
        self.costs.syncs += 1
        return rows_read

    def run(self, step: StepRows) -> None:
        """Run the step's rows; each row's logits row is then its next token's."""
        count = len(step.tokens)
        if not 0 < count <= self.max_rows:
            raise ValueError(f"a step runs 1 to {self.max_rows} rows, not {count}")
        ends = [start + len(tokens) for start, tokens in zip(step.starts, step.tokens, strict=True)]
        if min(len(tokens) for tokens in step.tokens) == 0 or max(ends) > self.max_positions:
            raise ValueError(f"every row runs a token, within {self.max_positions} positions")
        if self.buckets and all(len(tokens) == 1 for tokens in step.tokens):
            self._padded(step)
        else:
            self._run_once(step, ends)
        self._last_rows = count - step.unread
        if self.device == "cuda":
            self._binding.synchronize_outputs()  # ORT's stream computed them; the next reader may use another
            self.costs.syncs += 1

    def _tables(self, step: StepRows, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        full = np.full((rows, width), SCRATCH, np.int32)
        window = np.full((rows, width), SCRATCH, np.int32)
        for row, table in enumerate(step.tables):
            full[row, : len(table.full)] = table.full[:width]
            window[row, : len(table.window)] = table.window[:width]
        return full, window

    def _run_once(self, step: StepRows, ends: list[int]) -> None:
        rows = len(step.tokens)
        width = -(-max(ends) // self.page_size)
        full, window = self._tables(step, rows, width)
        inputs = {
            "input_ids": np.fromiter((t for tokens in step.tokens for t in tokens), np.int64),
            "positions": np.concatenate(
                [np.arange(s, e, dtype=np.int32) for s, e in zip(step.starts, ends, strict=True)]
            ),
            "token_rows": np.repeat(np.arange(rows, dtype=np.int32), [len(tokens) for tokens in step.tokens]),
            "full_pages": full,
            "window_pages": window,
            "last_tokens": np.cumsum([len(t) for t in step.tokens[: rows - step.unread]], dtype=np.int64) - 1,
        }
        for name, value in inputs.items():
            self._binding.bind_cpu_input(name, value)
        place, device_id = self._place
        vocab = self.config.vocab_size
        logits = [rows - step.unread, vocab]  # no unembedding for the rows nobody reads
        self._binding.bind_output("logits", place, device_id, np.float32, logits, self._logits.data_ptr())
        with self.costs.run(inputs.values()):
            self.session.run_with_iobinding(self._binding, self._run_options(-1) if self.cuda_graph else None)

    def _padded(self, step: StepRows) -> None:
        """A decode step padded to its bucket, from the bucket's fixed buffers: with CUDA graphs, the graph of the
        bucket (captured at its first run) replayed."""
        rows = len(step.tokens)
        size = bucket(rows, self.max_rows)
        binding, buffers = self._graph_binding(size)
        width = -(-self.max_positions // self.page_size)
        full, window = self._tables(step, size, width)
        ids = np.zeros(size, np.int64)
        ids[:rows] = [tokens[0] for tokens in step.tokens]
        positions = np.zeros(size, np.int32)
        positions[:rows] = step.starts
        inputs = (("input_ids", ids), ("positions", positions), ("full_pages", full), ("window_pages", window))
        for name, value in inputs:
            buffers[name].update_inplace(value)
        with self.costs.run(value for _, value in inputs):
            self.session.run_with_iobinding(binding, self._run_options(size) if self.cuda_graph else None)

    def _graph_binding(self, size: int) -> tuple[ort.IOBinding, dict[str, ort.OrtValue]]:
        """The binding of a decode bucket: the pools, fixed device buffers for its inputs, and its logits rows."""
        if size not in self._graph_bindings:
            binding = self._bound()
            place, device_id = self._place
            width = -(-self.max_positions // self.page_size)
            shapes = {
                "input_ids": ([size], np.int64, None),
                "positions": ([size], np.int32, None),
                "token_rows": ([size], np.int32, np.arange(size, dtype=np.int32)),
                "full_pages": ([size, width], np.int32, None),
                "window_pages": ([size, width], np.int32, None),
                "last_tokens": ([size], np.int64, np.arange(size, dtype=np.int64)),
            }
            buffers = {}
            for name, (shape, dtype, initial) in shapes.items():
                buffers[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, place, device_id)
                if initial is not None:
                    buffers[name].update_inplace(initial)
                binding.bind_ortvalue_input(name, buffers[name])
            vocab = self.config.vocab_size
            binding.bind_output("logits", place, device_id, np.float32, [size, vocab], self._logits.data_ptr())
            self._graph_bindings[size] = (binding, buffers)
        return self._graph_bindings[size]

    def _run_options(self, graph_id: int) -> ort.RunOptions:
        """Run options naming the CUDA graph to capture or replay (-1: none), made once per id."""
        if graph_id not in self._graph_run_options:
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            self._graph_run_options[graph_id] = options
        return self._graph_run_options[graph_id]
