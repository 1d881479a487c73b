"""Decode batches padded to bucket sizes (1, 2, 4, ... up to every slot), so that CUDA graphs are captured for a
few sizes only: the padding slots write at their parked positions (a slot's kept prefix stays whole), and
every sequence gets the tokens it gets without buckets. Run on the CPU, where the padding is the same."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from engine_fixtures import export_model, make_checkpoint, tiny_config

from backends.base import Chunk, GenerateRequest, Sampling
from backends.engine.batcher import Batcher, Sequence
from backends.engine.kernels.build import kernel_library
from backends.engine.runtime import DecoderRuntime, bucket

SLOTS = 5
POSITIONS = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return export_model(make_checkpoint(tmp_path_factory.mktemp("buckets") / "model", tiny_config(), "hf"), POSITIONS)


def _runtime(model: str, buckets: bool) -> DecoderRuntime:
    return DecoderRuntime(model, tiny_config(), SLOTS, POSITIONS, kernels=kernel_library(), buckets=buckets)


def test_the_buckets():
    assert [bucket(rows, SLOTS) for rows in range(1, SLOTS + 1)] == [1, 2, 4, 4, 5]
    assert [bucket(rows, 256) for rows in (1, 3, 17, 129, 256)] == [1, 4, 32, 256, 256]


def test_a_padding_slot_keeps_its_prefix(model):
    """Slot 3 holds a prompt; three sequences decode on slots 0-2 (a span of 4 with buckets, slot 3 parked past
    its prompt); slot 3 then goes on from its prompt exactly as on a runtime without buckets."""
    prompt = list(range(300, 340))

    def run(buckets: bool) -> list[np.ndarray]:
        runtime = _runtime(model, buckets)
        runtime.fill(3, prompt)
        for slot in range(3):
            runtime.fill(slot, [10 + slot, 20, 30])
        for step in range(4):
            runtime.step([(slot, 50 + step, 3 + step) for slot in range(3)], parked={3: len(prompt)})
        return [runtime.decode([(3, 77, len(prompt))])[3], runtime.decode([(3, 78, len(prompt) + 1)])[3]]

    for padded, plain in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(padded, plain, atol=1e-5)


def _generate(runtime: DecoderRuntime, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[int], int]:
    """Greedy tokens for each prompt (the first alone, then the others at once; the prefix cache on), the spans
    each step ran, and the prompt tokens the last prompt reused."""
    spans: list[int] = []
    inner_step = runtime.step

    def recording_step(rows, parked=None):
        spans.append(runtime.span(max(slot for slot, _, _ in rows) + 1))
        inner_step(rows, parked)

    runtime.step = recording_step  # type: ignore[method-assign]
    batcher = Batcher(runtime, prefill_chunk=16, prefix_block=4, prefix_budget=SLOTS * POSITIONS)
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]

    def emit(index: int):
        def take(item: Chunk | BaseException | None) -> None:
            if isinstance(item, Chunk):
                outputs[index] += item.tokens
            else:
                assert item is None, item
                done[index].set()

        return take

    for wave in ([0], range(1, len(prompts))):  # the first ends before the others start: its slot keeps its prefix
        for index in wave:
            request = GenerateRequest(prompts[index], steps, (), f"r{index}", Sampling(temperature=0))
            sequence = Sequence(request, emit(index), np.random.default_rng(index))
            batcher.submit(sequence)
        for index in wave:
            assert done[index].wait(120)
    batcher.close()
    return outputs, spans, sequence.reused


def test_sequences_get_the_same_tokens_with_buckets(model):
    prompts = [list(range(100, 140)), [5, 6, 7], list(range(900, 930)), [42, 43], list(range(100, 140))]
    padded, spans, reused = _generate(_runtime(model, True), prompts, 24)
    plain, plain_spans, _ = _generate(_runtime(model, False), prompts, 24)
    assert padded == plain and padded[4] == padded[0]
    assert reused >= 36  # the last prompt repeats the first: its kept prefix, past padded steps, reused
    assert set(spans) <= {1, 2, 4, SLOTS} and 3 in plain_spans  # the padding happened
