"""Continuous batching on one engine thread: sequences join between decode steps (their prompt is
prefilled into a KV slot, one chunk per step, so that a long prompt does not stall the others),
every decoding sequence advances by one token per step (the step's next tokens chosen together, by the
SampleTokens kernels on the runtime's device where they are loaded), and a finished or cancelled sequence
frees its slot at once. A sequence starts from the longest prefix of its prompt that a slot already holds in its
namespace (prefix_cache.py): it takes that slot over, or the held positions are copied into its own."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from backends.base import Chunk, EngineStats, GenerateRequest, TokenLogprob
from harmony.tokens import FIRST_SPECIAL

from .grammar import TokenGuide
from .prefix_cache import PrefixCache
from .runtime import DecoderRuntime
from .sampler import RowSpec, sampling_rows

log = structlog.get_logger("backends.engine")

Emit = Callable[[Chunk | BaseException | None], None]  # a token (and its logprob), a failure, or None at the end


@dataclass(eq=False)
class Sequence:
    request: GenerateRequest
    emit: Emit
    rng: np.random.Generator
    namespace: bytes = b""  # the prefix cache's: only a slot filled in the same namespace is reused
    slot: int = -1
    reused: int = 0  # prompt tokens taken from the prefix cache (set before the first token is emitted)
    position: int = 0  # positions filled in the slot's KV cache
    decoding: bool = False  # the prompt is all in; each step feeds `token`
    generated: int = 0
    token: int = 0  # the last sampled token, fed at the next decode step
    guide: TokenGuide | None = None  # the output constraint's grammar, when the request has one
    counts: dict[int, int] = field(default_factory=dict)  # text tokens generated so far (for the penalties)
    cancelled: threading.Event = field(default_factory=threading.Event)


class Batcher:
    def __init__(
        self, runtime: DecoderRuntime, prefill_chunk: int = 512, prefix_block: int = 32, prefix_budget: int = 0
    ) -> None:
        """`prefix_budget`: tokens idle slots keep for later sequences to reuse (0: no reuse)."""
        self.runtime = runtime
        self.prefill_chunk = prefill_chunk
        self.prefix = PrefixCache(runtime.slots, prefix_block, prefix_budget)
        self._prefix_stats = self.prefix.stats()
        self._incoming: queue.Queue[Sequence | None] = queue.Queue()
        self._waiting: Sequence | None = None  # taken from the queue, waiting for a slot
        self._active: dict[int, Sequence] = {}  # slot → the sequence holding it (prefilling or decoding)
        self._prefilling: list[Sequence] = []  # in arrival order
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
        runtime, prefix = self.runtime, self._prefix_stats
        return EngineStats(
            running=len(self._active),
            waiting=self._incoming.qsize() + (self._waiting is not None),
            slots=runtime.slots,
            kv_tokens=self._kv_tokens,
            kv_capacity_tokens=runtime.slots * runtime.max_positions,
            decode_steps=self._decode_steps,
            prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
            prefix_lookup_tokens=prefix.lookup_tokens,
            prefix_hit_tokens=prefix.hit_tokens,
            prefix_blocks=prefix.blocks,
            prefix_evicted_blocks=prefix.evicted_blocks,
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
            self._prefix_stats = self.prefix.stats()

    def _admit(self) -> bool:
        """Give waiting sequences slots, in arrival order (blocking while idle); False once closed."""
        while True:
            sequence = self._waiting
            if sequence is None:
                if self.prefix.free_slots() == 0:
                    return True
                try:
                    sequence = self._incoming.get(block=not self._active)
                except queue.Empty:
                    return True
                if sequence is None:
                    self._fail_all(RuntimeError("the engine stopped"))
                    return False
            self._waiting = None
            if sequence.cancelled.is_set():
                continue
            if not self._place(sequence):
                self._waiting = sequence
                return True

    def _place(self, sequence: Sequence) -> bool:
        """Give the sequence a slot holding as much of its prompt as any slot does; False: none is free."""
        prompt = sequence.request.prompt
        placement = self.prefix.place(sequence.namespace, prompt)
        if placement is None:
            return False
        if placement.source is not None:
            self.runtime.copy_prefix(placement.source, placement.slot, placement.reused)
        self.prefix.count(len(prompt), placement.reused)
        sequence.slot, sequence.position, sequence.reused = placement.slot, placement.reused, placement.reused
        self._active[sequence.slot] = sequence
        self._prefilling.append(sequence)
        return True

    def _prefill_chunk(self, sequence: Sequence) -> None:
        """Run the next chunk of the prompt; after the last one the sequence samples its first token."""
        prompt = sequence.request.prompt
        chunk = prompt[sequence.position : sequence.position + self.prefill_chunk]
        try:
            self.runtime.fill(sequence.slot, chunk, sequence.position)
        except Exception as exc:  # a bad prompt fails its own sequence only
            self.prefix.forget(sequence.slot)
            self._finish(sequence, exc)
            return
        self.prefix.extend(sequence.slot, chunk)
        sequence.position += len(chunk)
        self._prefill_tokens += len(chunk)
        if sequence.position == len(prompt):
            self._prefilling.remove(sequence)
            sequence.decoding = True
            self._sample([sequence])

    def _step(self) -> None:
        decoding = [s for s in self._active.values() if s.decoding]
        rows = [(s.slot, s.token, s.position) for s in decoding]
        span = self.runtime.span(max(slot for slot, _, _ in rows) + 1)
        # the batch's other slots write a spare row past what they keep: a prefilling slot's next chunk
        # rewrites that position, an idle slot's kept prefix stays whole
        parked = {slot: self.prefix.held(slot) for slot in range(span) if slot not in self._active}
        parked.update((s.slot, s.position) for s in self._prefilling)
        try:
            self.runtime.step(rows, parked)
        except Exception as exc:
            log.exception("engine_step_failed")
            for slot in range(span):
                self.prefix.forget(slot)
            self._fail_all(exc)
            return
        self._decode_steps += 1
        self._decode_tokens += len(rows)
        for sequence in decoding:
            self.prefix.extend(sequence.slot, [sequence.token])
            sequence.position += 1
        self._sample(decoding)

    def _sample(self, sequences: list[Sequence]) -> None:
        """Choose each sequence's next token from its slot's logits row, all in one call, and take them."""
        specs = [
            RowSpec(
                s.slot,
                s.request.sampling,
                s.rng,
                None if s.guide is None else s.guide.allowed(),
                s.counts,
                s.request.top_logprobs,
            )
            for s in sequences
        ]
        try:
            sampled = self.runtime.sample(sampling_rows(specs, self.runtime.config.vocab_size))
        except Exception as exc:
            log.exception("engine_sampling_failed")
            for sequence in sequences:
                self._finish(sequence, exc)
            return
        for index, sequence in enumerate(sequences):
            self._take(sequence, int(sampled.tokens[index]), sampled.entry(index, sequence.request.top_logprobs))

    def _take(self, sequence: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        request = sequence.request
        if token < 0:
            self._finish(sequence, RuntimeError("the output constraint allows no token here"))
            return
        if sequence.guide is not None:
            try:
                sequence.guide.accept(token)
            except RuntimeError as exc:
                self._finish(sequence, exc)
                return
        sequence.token = token
        sequence.generated += 1
        sampling = request.sampling
        if token < FIRST_SPECIAL and (sampling.presence_penalty or sampling.frequency_penalty):
            sequence.counts[token] = sequence.counts.get(token, 0) + 1  # counted only where it is used
        sequence.emit(Chunk([token], logprobs=None if logprob is None else [logprob]))
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
            self.prefix.release(sequence.slot)
        if sequence in self._prefilling:
            self._prefilling.remove(sequence)

    def _fail_all(self, failure: BaseException) -> None:
        for sequence in list(self._active.values()):
            self._finish(sequence, failure)
