"""One ONNX Runtime session over the decoder graph, with preallocated KV caches for a fixed number of
sequence slots, bound in place through IO binding (no per-step copies of the cache)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from .config import ModelConfig
from .graph import kv_names


class DecoderRuntime:
    """`prefill` fills one slot from position 0; `decode` advances any set of slots by one token each."""

    def __init__(
        self,
        model_path: str,
        config: ModelConfig,
        slots: int,
        max_positions: int,
        threads: int = 0,
        kernels: Path | None = None,
    ) -> None:
        """`kernels`: a compiled kernel library; its MXFP4MoE replaces the graph's pure-ONNX realization."""
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if kernels is not None:
            options.register_custom_ops_library(str(kernels))
        self.session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        self.config = config
        self.slots = slots
        self.max_positions = max_positions
        shape = (slots, config.num_key_value_heads, max_positions, config.head_dim)
        self._cache = [np.zeros(shape, np.float32) for _ in range(2 * config.num_hidden_layers)]
        self._logits = np.zeros((slots, config.vocab_size), np.float32)
        self._bindings: dict[tuple[int, int], tuple[ort.IOBinding, np.ndarray]] = {}

    @property
    def kv_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._cache)

    def _binding(self, first_slot: int, rows: int) -> tuple[ort.IOBinding, np.ndarray]:
        """The IO binding of a window of slots, its KV and logits bound in place; made once per window."""
        key = (first_slot, rows)
        if key not in self._bindings:
            binding = self.session.io_binding()
            window = slice(first_slot, first_slot + rows)
            for layer in range(self.config.num_hidden_layers):
                past_k, past_v, present_k, present_v = kv_names(layer)
                for past, present, buffer in (
                    (past_k, present_k, self._cache[2 * layer]),
                    (past_v, present_v, self._cache[2 * layer + 1]),
                ):
                    value = ort.OrtValue.ortvalue_from_numpy(buffer[window])  # a view: updated in place
                    binding.bind_ortvalue_input(past, value)
                    binding.bind_ortvalue_output(present, value)
            logits = self._logits[window]
            binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
            self._bindings[key] = (binding, logits)
        return self._bindings[key]

    def _run(self, first_slot: int, rows: int, ids: np.ndarray, seqlens: np.ndarray, total: int) -> np.ndarray:
        binding, logits = self._binding(first_slot, rows)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("seqlens_k", seqlens)
        binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        self.session.run_with_iobinding(binding)
        return logits

    def prefill(self, slot: int, tokens: list[int], start: int = 0) -> np.ndarray:
        """Run prompt tokens into `slot` from position `start` (0 restarts its cache); the next-token logits [V]."""
        count = len(tokens)
        if not count > 0 or start + count > self.max_positions:
            raise ValueError(f"a prompt of {start + count} tokens does not fit {self.max_positions} positions")
        ids = np.array([tokens], np.int64)
        return self._run(slot, 1, ids, np.array([start + count - 1], np.int32), start + count)[0]

    def decode(self, rows: list[tuple[int, int, int]], parked: dict[int, int] | None = None) -> dict[int, np.ndarray]:
        """`rows`: (slot, token, position) each; the next-token logits per slot.

        The batch spans slots 0..max(slot); the other slots in it get a throwaway token, written at the
        position `parked` gives for the slot (one a later prefill overwrites) or else at position 0.
        """
        span = max(slot for slot, _, _ in rows) + 1
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
        logits = self._run(0, span, ids, seqlens, int(seqlens.max()) + 1)
        return {slot: logits[slot] for slot, _, _ in rows}
