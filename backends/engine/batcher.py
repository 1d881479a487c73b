"""Continuous batching on one engine thread: sequences join between decode steps (their prompt is
prefilled into a free KV slot, one chunk per step, so that a long prompt does not stall the others),
every decoding sequence advances by one token per step, and a finished or cancelled sequence frees its
slot at once."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from backends.base import EngineStats, GenerateRequest

from .grammar import TokenGuide
from .runtime import DecoderRuntime
from .sampler import next_token

log = structlog.get_logger("backends.engine")

Emit = Callable[[list[int] | BaseException | None], None]  # a token, a failure, or None at the end


@dataclass(eq=False)
class Sequence:
    request: GenerateRequest
    emit: Emit
    rng: np.random.Generator
    slot: int = -1
    position: int = 0  # positions filled in the slot's KV cache
    decoding: bool = False  # the prompt is all in; each step feeds `token`
    generated: int = 0
    token: int = 0  # the last sampled token, fed at the next decode step
    guide: TokenGuide | None = None  # the output constraint's grammar, when the request has one
    cancelled: threading.Event = field(default_factory=threading.Event)


class Batcher:
    def __init__(self, runtime: DecoderRuntime, prefill_chunk: int = 512) -> None:
        self.runtime = runtime
        self.prefill_chunk = prefill_chunk
        self._incoming: queue.Queue[Sequence | None] = queue.Queue()
        self._active: dict[int, Sequence] = {}  # slot → the sequence holding it (prefilling or decoding)
        self._prefilling: list[Sequence] = []  # in arrival order
        self._free = list(range(runtime.slots))
        self._kv_tokens = 0  # positions filled in active slots, as of the last step
        self._decode_steps = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="gpt-oss-engine", daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        return len(self._active)

    def stats(self) -> EngineStats:
        """Read from other threads: each figure is one the engine thread last wrote."""
        runtime = self.runtime
        return EngineStats(
            running=len(self._active),
            waiting=self._incoming.qsize(),
            slots=runtime.slots,
            kv_tokens=self._kv_tokens,
            kv_capacity_tokens=runtime.slots * runtime.max_positions,
            decode_steps=self._decode_steps,
            prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
        )

    def submit(self, sequence: Sequence) -> None:
        self._incoming.put(sequence)

    def close(self) -> None:
        self._incoming.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            if not self._admit():
                return
            for sequence in [s for s in self._active.values() if s.cancelled.is_set()]:
                self._release(sequence)
            if self._prefilling:
                self._prefill_chunk(self._prefilling[0])
            if any(sequence.decoding for sequence in self._active.values()):
                self._step()
            self._kv_tokens = sum(sequence.position for sequence in self._active.values())

    def _admit(self) -> bool:
        """Give waiting sequences free slots (blocking while idle); False once closed."""
        while self._free:
            try:
                sequence = self._incoming.get(block=not self._active)
            except queue.Empty:
                return True
            if sequence is None:
                self._fail_all(RuntimeError("the engine stopped"))
                return False
            if sequence.cancelled.is_set():
                continue
            sequence.slot = min(self._free)
            self._free.remove(sequence.slot)
            self._active[sequence.slot] = sequence
            self._prefilling.append(sequence)
        return True

    def _prefill_chunk(self, sequence: Sequence) -> None:
        """Run the next chunk of the prompt; after the last one the sequence samples its first token."""
        prompt = sequence.request.prompt
        chunk = prompt[sequence.position : sequence.position + self.prefill_chunk]
        try:
            logits = self.runtime.prefill(sequence.slot, chunk, sequence.position)
        except Exception as exc:  # a bad prompt fails its own sequence only
            self._finish(sequence, exc)
            return
        sequence.position += len(chunk)
        self._prefill_tokens += len(chunk)
        if sequence.position == len(prompt):
            self._prefilling.remove(sequence)
            sequence.decoding = True
            self._accept(sequence, logits)

    def _step(self) -> None:
        decoding = [s for s in self._active.values() if s.decoding]
        rows = [(s.slot, s.token, s.position) for s in decoding]
        parked = {s.slot: s.position for s in self._prefilling}  # their next chunk rewrites that position
        try:
            logits = self.runtime.decode(rows, parked)
        except Exception as exc:
            log.exception("engine_step_failed")
            self._fail_all(exc)
            return
        self._decode_steps += 1
        self._decode_tokens += len(rows)
        for sequence in decoding:
            sequence.position += 1
            self._accept(sequence, logits[sequence.slot])

    def _accept(self, sequence: Sequence, logits: np.ndarray) -> None:
        request = sequence.request
        guide = sequence.guide
        if guide is not None:
            logits = guide.mask(logits)
        token = next_token(logits, request.sampling, sequence.rng)
        if guide is not None:
            try:
                guide.accept(token)
            except RuntimeError as exc:
                self._finish(sequence, exc)
                return
        sequence.token = token
        sequence.generated += 1
        sequence.emit([token])
        done = (
            token in request.stop_ids
            or sequence.generated >= request.max_new_tokens
            or sequence.position + 1 >= self.runtime.max_positions
        )
        if done:
            self._finish(sequence, None)

    def _finish(self, sequence: Sequence, failure: BaseException | None) -> None:
        sequence.emit(failure)
        self._release(sequence)

    def _release(self, sequence: Sequence) -> None:
        if self._active.pop(sequence.slot, None) is not None:
            self._free.append(sequence.slot)
        if sequence in self._prefilling:
            self._prefilling.remove(sequence)

    def _fail_all(self, failure: BaseException) -> None:
        for sequence in list(self._active.values()):
            self._finish(sequence, failure)
