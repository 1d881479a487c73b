"""Decode steps padded to bucket sizes (1, 2, 4, ... up to the largest batch), their inputs in fixed buffers of
full page-table width, so that CUDA graphs are captured for a few sizes only: the padding rows write to the
scratch page (no sequence's pages change), and every sequence gets the tokens it gets without buckets. Run on
the CPU, where the padding and the fixed buffers are the same."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from engine_fixtures import export_model, make_checkpoint, tiny_config

from backends.base import Chunk, GenerateRequest, Sampling
from backends.engine.batcher import Batcher, Sequence
from backends.engine.kernels.build import kernel_library
from backends.engine.page_pool import KvPools
from backends.engine.paged_runner import PagedRunner
from backends.engine.runtime import DecoderRuntime, bucket

ROWS = 5
POSITIONS = 256
PAGE = 32


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return export_model(make_checkpoint(tmp_path_factory.mktemp("buckets") / "model", tiny_config(), "hf"), POSITIONS)


def test_the_buckets():
    assert [bucket(rows, ROWS) for rows in range(1, ROWS + 1)] == [1, 2, 4, 4, 5]
    assert [bucket(rows, 256) for rows in (1, 3, 17, 129, 256)] == [1, 4, 32, 256, 256]


def test_padding_rows_leave_every_sequence_s_pages_whole(model):
    """Sequence 3 holds a prompt; three sequences decode beside it (padded to 4 with buckets); sequence 3 then goes
    on from its prompt exactly as on a runtime without buckets."""
    prompt = list(range(300, 340))

    def run(buckets: bool) -> list[np.ndarray]:
        runner = PagedRunner.create(model, tiny_config(), ROWS, POSITIONS, kernels=kernel_library(), buckets=buckets)
        runner.prefill(3, prompt)
        for sequence in range(3):
            runner.prefill(sequence, [10 + sequence, 20, 30])
        for step in range(4):
            runner.decode([(sequence, 50 + step, 3 + step) for sequence in range(3)])
        return [runner.decode([(3, 77, len(prompt))])[3], runner.decode([(3, 78, len(prompt) + 1)])[3]]

    for padded, plain in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(padded, plain, atol=1e-5)


def _generate(
    buckets: bool, model: str, prompts: list[list[int]], steps: int
) -> tuple[list[list[int]], list[int], int]:
    """Greedy tokens for each prompt (the first alone, then the others at once; the prefix cache on), the rows
    each padded step ran, and the prompt tokens the last prompt reused."""
    pages = ROWS * POSITIONS // PAGE + 2
    pools = KvPools(pages, pages, PAGE, tiny_config().sliding_window)
    runtime = DecoderRuntime(
        model, tiny_config(), ROWS + 1, POSITIONS, pages, pages, PAGE, kernels=kernel_library(), buckets=buckets
    )
    padded_rows: list[int] = []
    inner = runtime._padded

    def recording(step):
        padded_rows.append(bucket(len(step.tokens), runtime.max_rows))
        inner(step)

    runtime._padded = recording  # type: ignore[method-assign]
    batcher = Batcher(runtime, pools, ROWS, prefill_chunk=16, prefix_budget=pages * PAGE)
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

    for wave in ([0], range(1, len(prompts))):  # the first ends before the others start: its pages stay cached
        for index in wave:
            request = GenerateRequest(prompts[index], steps, (), f"r{index}", Sampling(temperature=0))
            sequence = Sequence(request, emit(index), np.random.default_rng(index))
            batcher.submit(sequence)
        for index in wave:
            assert done[index].wait(120)
    batcher.close()
    return outputs, padded_rows, sequence.reused


def test_sequences_get_the_same_tokens_with_buckets(model):
    prompts = [list(range(100, 140)), [5, 6, 7], list(range(900, 930)), [42, 43], list(range(100, 140))]
    padded, rows, reused = _generate(True, model, prompts, 24)
    plain, plain_rows, _ = _generate(False, model, prompts, 24)
    assert padded == plain and padded[4] == padded[0]
    assert reused == 39  # the last prompt repeats the first: its cached page and a copy of its tail reused
    assert 4 in rows and not plain_rows  # the padding happened


def _alone_in_three_pages(model: str, request: GenerateRequest, prefix_budget: int) -> tuple[list, KvPools]:
    """What a request alone in pools of three pages (96 positions) emitted until it ended, and the pools."""
    pools = KvPools(4, 8, PAGE, tiny_config().sliding_window)
    runtime = DecoderRuntime(model, tiny_config(), 2, POSITIONS, 4, 8, PAGE, kernels=kernel_library())
    batcher = Batcher(runtime, pools, 1, prefill_chunk=16, prefix_budget=prefix_budget)
    outcome: list[Chunk | BaseException | None] = []
    done = threading.Event()

    def emit(item: Chunk | BaseException | None) -> None:
        outcome.append(item)
        if not isinstance(item, Chunk):
            done.set()

    batcher.submit(Sequence(request, emit, np.random.default_rng()))
    assert done.wait(30)
    batcher.close()
    return outcome, pools


def test_a_prompt_the_empty_pools_cannot_hold_fails_instead_of_waiting_forever(model):
    request = GenerateRequest(list(range(200)), 4, (), "big", Sampling())
    outcome, _ = _alone_in_three_pages(model, request, prefix_budget=0)
    assert isinstance(outcome[0], RuntimeError) and "more KV pages" in str(outcome[0])


def test_an_answer_the_empty_pools_cannot_hold_fails_instead_of_trading_places_with_itself(model):
    """A prompt of 60 tokens fits in three pages; its answer outgrows them. Alone, it was its own victim: preempted,
    placed again from the pages the cache kept, preempted again, forever. It fails once nothing else can give."""
    request = GenerateRequest(list(range(300, 360)), 80, (), "long", Sampling(temperature=0))
    outcome, pools = _alone_in_three_pages(model, request, prefix_budget=4 * PAGE)
    tokens = sum(len(item.tokens) for item in outcome if isinstance(item, Chunk))
    # its tokens up to the one chosen at position 95 (whose own position there is no page for)
    assert tokens == 96 - 60 + 1 and isinstance(outcome[-1], RuntimeError) and "more KV pages" in str(outcome[-1])
    assert pools.full.stats().in_use == 0
