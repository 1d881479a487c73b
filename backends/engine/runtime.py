"""One ONNX Runtime session over the decoder graph, on the CPU or a CUDA device, with preallocated KV
caches for a fixed number of sequence slots, bound in place through IO binding (no per-step copies of
the cache). On CUDA the caches and logits live on the device. Each slot's next-token logits land in its
row of one logits buffer, where the SampleTokens op (sampling_session.py, with the compiled kernels)
chooses the next tokens on the same device: only token ids and asked-for logprobs come back; without the
kernels the NumPy sampler reads the rows on the host. With `cuda_graph`, a decode batch spans a bucket of
slots (1, 2, 4, ... up to all of them), each bucket captured once as a CUDA graph and replayed: its token
and length inputs sit in fixed device buffers, updated in place."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import io
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .config import ModelConfig
from .graph import DTYPES, Dtype, kv_names
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


def _host_view(address: int, shape: tuple[int, int, int]) -> np.ndarray:
    """A writable byte view of host memory that an OrtValue owns."""
    size = shape[0] * shape[1] * shape[2]
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address)).reshape(shape)


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime the CUDA provider loaded (its soname first: the process holds it already)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(name)
    raise EngineDeviceError("the CUDA runtime library (libcudart) is not loadable to copy KV between slots")


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
        raise EngineDeviceError(f"copying KV between slots failed (CUDA error {status})")


def bucket(rows: int, slots: int) -> int:
    """The CUDA-graph bucket (1, 2, 4, ... up to `slots`) a decode batch of `rows` slots is padded to."""
    return min(slots, 1 << (rows - 1).bit_length())


class DecoderRuntime:
    """`fill` runs prompt tokens into one slot; `step` advances any set of slots by one token each; `sample`
    chooses their next tokens from the logits those left (`prefill` and `decode` return the logits instead)."""

    def __init__(
        self,
        model_path: str,
        config: ModelConfig,
        slots: int,
        max_positions: int,
        threads: int = 0,
        kernels: Path | None = None,
        device: Literal["cpu", "cuda"] = "cpu",
        device_id: int = 0,
        dtype: Dtype = "float32",
        cuda_graph: bool = False,
        buckets: bool | None = None,
    ) -> None:
        """`kernels`: a compiled kernel library; its MXFP4MoE replaces the graph's pure-ONNX realization and
        its SampleTokens samples on this runtime's device. `dtype`: the graph's activation and KV dtype.
        `buckets`: decode spans padded to the bucket sizes (None: with CUDA graphs, so that few are captured)."""
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
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
        self.session = ort.InferenceSession(model_path, options, providers=providers)
        if device == "cuda" and self.session.get_providers()[0] != CUDA:
            raise EngineDeviceError("the CUDA provider did not load for the decoder graph")
        self.config = config
        self.slots = slots
        self.max_positions = max_positions
        self.device = device
        self.cuda_graph = cuda_graph and device == "cuda"
        self.buckets = self.cuda_graph if buckets is None else buckets
        self._place = ("cuda", device_id) if device == "cuda" else ("cpu", 0)
        self._kv_type = DTYPES[dtype][0]
        self._kv_shape = (config.num_key_value_heads, max_positions, config.head_dim)
        self._cache = [
            self._zeros((slots, *self._kv_shape), DTYPES[dtype][1]) for _ in range(2 * config.num_hidden_layers)
        ]
        self._kv_itemsize = DTYPES[dtype][1].itemsize
        self._logits = self._zeros((slots, config.vocab_size), np.dtype(np.float32))
        self._sampler = (
            None if kernels is None else SamplingSession(kernels, sampler_providers, self._place, self._logits, threads)
        )
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._graph_inputs: dict[int, tuple[ort.OrtValue, ort.OrtValue]] = {}
        self._graph_run_options: dict[int, ort.RunOptions] = {}
        self._last_run: tuple[int, ort.IOBinding] | None = None  # (first slot, binding) of the last run

    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        """A zeroed buffer in this runtime's memory, bound by address with its real type (host memory is
        shared with a NumPy array; device memory is copied from zero pages: a fresh allocation holds
        whatever was there, and attention must not meet it)."""
        storage = np.zeros(shape, np.uint16 if dtype.itemsize == 2 else dtype)  # zero bits: zero in any float
        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(storage, helper.np_dtype_to_tensor_dtype(dtype))
        return ort.OrtValue.ortvalue_from_numpy(storage, *self._place)

    def copy_prefix(self, source: int, target: int, count: int) -> None:
        """Copy positions [0, count) of every layer's keys and values from slot `source` to slot `target`."""
        if count <= 0 or source == target:
            return
        heads, positions, head_dim = self._kv_shape
        row = head_dim * self._kv_itemsize  # one position of one head
        slot_bytes = heads * positions * row
        for buffer in self._cache:
            base = buffer.data_ptr()
            if self.device == "cpu":
                storage = _host_view(base, (self.slots, heads, positions * row))
                storage[target, :, : count * row] = storage[source, :, : count * row]
            else:
                copy_device_rows(
                    base + target * slot_bytes, base + source * slot_bytes, positions * row, count * row, heads
                )

    @property
    def kv_bytes(self) -> int:
        return sum(value.tensor_size_in_bytes() for value in self._cache)

    def _binding(self, first_slot: int, rows: int) -> ort.IOBinding:
        """The IO binding of a window of slots, its KV and logits bound in place; made once per window."""
        key = (first_slot, rows)
        if key not in self._bindings:
            binding = self.session.io_binding()
            place, device_id = self._place
            vocab = self.config.vocab_size
            pointer = self._logits.data_ptr() + first_slot * vocab * 4
            binding.bind_output("logits", place, device_id, np.float32, [rows, vocab], pointer)  # output 0
            kv_bytes = self._cache[0].tensor_size_in_bytes() // self.slots
            shape = [rows, *self._kv_shape]
            for layer in range(self.config.num_hidden_layers):
                past_k, past_v, present_k, present_v = kv_names(layer)
                for past, present, buffer in (
                    (past_k, present_k, self._cache[2 * layer]),
                    (past_v, present_v, self._cache[2 * layer + 1]),
                ):
                    pointer = buffer.data_ptr() + first_slot * kv_bytes
                    binding.bind_input(past, place, device_id, self._kv_type, shape, pointer)
                    binding.bind_output(present, place, device_id, self._kv_type, shape, pointer)
            self._bindings[key] = binding
        return self._bindings[key]

    @property
    def samples_on_device(self) -> bool:
        """Whether the SampleTokens kernels choose the tokens (else the NumPy sampler, on the host)."""
        return self._sampler is not None

    def sample(self, rows: SamplingRows) -> Sampled:
        """Next tokens from the logits rows the last steps left (`rows.rows`: slots)."""
        if self._sampler is not None:
            return self._sampler.sample(rows)
        slots = sorted(set(rows.rows.tolist()))
        local = np.searchsorted(np.array(slots), rows.rows).astype(np.int32)  # each row's index among `slots`
        return sample_rows(self.logits(slots), dataclasses.replace(rows, rows=local))

    def logits(self, slots: list[int]) -> np.ndarray:
        """A host copy of these slots' logits rows, as the last steps left them."""
        vocab = self.config.vocab_size
        if self.device == "cpu":
            view = np.ctypeslib.as_array((ctypes.c_float * (self.slots * vocab)).from_address(self._logits.data_ptr()))
            return view.reshape(self.slots, vocab)[slots]  # fancy indexing copies
        if self._last_run is None:
            raise ValueError("no step has run: there are no logits yet")
        first, binding = self._last_run  # the window of slots the last run wrote: copied whole, once
        window = binding.get_outputs()[0].numpy()
        if not all(first <= slot < first + len(window) for slot in slots):
            raise ValueError(f"slots {slots} are not all in the last run's window")
        return window[[slot - first for slot in slots]]

    def _run(self, first_slot: int, rows: int, ids: np.ndarray, seqlens: np.ndarray, total: int) -> None:
        binding = self._binding(first_slot, rows)
        graph_id = -1  # not replayed: prefill chunks, windows not at slot 0
        if self.cuda_graph and ids.shape[1] == 1 and first_slot == 0:
            graph_id = rows
            ids_value, seqlens_value = self._graph_input_buffers(rows)
            ids_value.update_inplace(ids)
            seqlens_value.update_inplace(seqlens)
            binding.bind_ortvalue_input("input_ids", ids_value)
            binding.bind_ortvalue_input("seqlens_k", seqlens_value)
            # a replayed graph keeps the values it was captured with: attend up to the cache's end, the
            # device-side sequence lengths bound each row
            binding.bind_cpu_input("total_sequence_length", np.array(self.max_positions, np.int32))
        else:
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("seqlens_k", seqlens)
            binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        self.session.run_with_iobinding(binding, self._run_options(graph_id) if self.cuda_graph else None)
        self._last_run = (first_slot, binding)
        if self.device == "cuda":
            binding.synchronize_outputs()  # ORT's stream computed them; the next reader may use another

    def _run_options(self, graph_id: int) -> ort.RunOptions:
        """Run options naming the CUDA graph to capture or replay (-1: none), made once per id."""
        if graph_id not in self._graph_run_options:
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            self._graph_run_options[graph_id] = options
        return self._graph_run_options[graph_id]

    def _graph_input_buffers(self, rows: int) -> tuple[ort.OrtValue, ort.OrtValue]:
        """Fixed device buffers for the token ids and lengths of a decode batch of `rows`."""
        if rows not in self._graph_inputs:
            place, device_id = self._place
            self._graph_inputs[rows] = (
                ort.OrtValue.ortvalue_from_shape_and_type([rows, 1], np.int64, place, device_id),
                ort.OrtValue.ortvalue_from_shape_and_type([rows], np.int32, place, device_id),
            )
        return self._graph_inputs[rows]

    def fill(self, slot: int, tokens: list[int], start: int = 0) -> None:
        """Run prompt tokens into `slot` from position `start` (0 restarts its cache); its logits row is the
        next token's."""
        count = len(tokens)
        if not count > 0 or start + count > self.max_positions:
            raise ValueError(f"a prompt of {start + count} tokens does not fit {self.max_positions} positions")
        ids = np.array([tokens], np.int64)
        self._run(slot, 1, ids, np.array([start + count - 1], np.int32), start + count)

    def prefill(self, slot: int, tokens: list[int], start: int = 0) -> np.ndarray:
        """`fill`, then the next-token logits [V] on the host."""
        self.fill(slot, tokens, start)
        return self.logits([slot])[0]

    def decode(self, rows: list[tuple[int, int, int]], parked: dict[int, int] | None = None) -> dict[int, np.ndarray]:
        """`step`, then the next-token logits per slot on the host."""
        self.step(rows, parked)
        slots = [slot for slot, _, _ in rows]
        return dict(zip(slots, self.logits(slots), strict=True))

    def span(self, rows: int) -> int:
        """The slots a decode batch reaching slot `rows - 1` runs: `rows`, or with buckets its bucket."""
        return bucket(rows, self.slots) if self.buckets else rows

    def step(self, rows: list[tuple[int, int, int]], parked: dict[int, int] | None = None) -> None:
        """`rows`: (slot, token, position) each; each slot's logits row is then its next token's.

        The batch spans slots 0..span(max(slot) + 1) - 1; the other slots in it get a throwaway token, written
        at the position `parked` gives for the slot (one a later prefill overwrites) or else at position 0.
        """
        span = self.span(max(slot for slot, _, _ in rows) + 1)
        ids = np.zeros((span, 1), np.int64)
        seqlens = np.zeros(span, np.int32)
        for slot, position in (parked or {}).items():
            if slot < span:
                seqlens[slot] = position
        for slot, token, position in rows:
            if position >= self.max_positions:
                raise ValueError(f"position {position} is past the cache of {self.max_positions}")
            ids[slot, 0] = token
            seqlens[slot] = position
        self._run(0, span, ids, seqlens, int(seqlens.max()) + 1)
