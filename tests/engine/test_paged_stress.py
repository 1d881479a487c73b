"""The paged engine under a load that makes it share, copy, evict and preempt at once: prompts from four families
sharing prefixes, of 5 to 120 tokens, some streams closed early, through a pool of ten pages of 16 positions for
six sequences, arriving at once or spread over 0.3 s from two tenants in two tiers. Every answer that runs to its
end is the one its prompt gets alone in an engine with room and no prefix cache, and once all is done no page is
held: each is free or cached, its reference count zero."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import Chunk, GenerateRequest, Sampling, SchedulingTier
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.batcher import Batcher, Sequence
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.page_pool import KvPools
from backends.engine.runtime import DecoderRuntime
from harmony import load_harmony_encoding

ENCODING = load_harmony_encoding()
GREEDY = Sampling(temperature=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("stress") / "model", tiny_config(), "hf")


def _load() -> list[tuple[list[int], int, int | None]]:
    """(prompt, new tokens, tokens after which the stream is closed or None) for 30 requests."""
    rng = np.random.default_rng(11)
    families = [rng.integers(1000, 190_000, 120).tolist() for _ in range(4)]
    load = []
    for index in range(30):
        family = families[index % 4]
        shared = int(rng.integers(0, 100))
        prompt = family[:shared] + rng.integers(1000, 190_000, int(rng.integers(5, 40))).tolist()
        new_tokens = int(rng.integers(10, 60))
        closed = int(rng.integers(1, new_tokens)) if index % 7 == 3 else None
        load.append((prompt[:120], new_tokens, closed))
    return load


async def _answer(
    backend: EngineBackend,
    prompt: list[int],
    count: int,
    closed: int | None,
    tenant: str = "t",
    tier: SchedulingTier = "default",
) -> list[int]:
    tokens: list[int] = []
    request = GenerateRequest(prompt, count, (), "stress", GREEDY, tenant=tenant, tier=tier)
    stream = backend.generate(request)
    async for chunk in stream:
        tokens += chunk.tokens
        if closed is not None and len(tokens) >= closed:
            await stream.aclose()
            break
    return tokens


def _options(checkpoint: Path, **extra) -> EngineOptions:
    return EngineOptions(
        checkpoint=str(checkpoint), max_positions=192, cache_dir=str(checkpoint.parent / "graphs"), **extra
    )


@pytest.fixture(scope="module")
def alone(checkpoint) -> list[list[int]]:
    """Each prompt's answer alone, in an engine with room and no prefix cache."""

    async def answers() -> list[list[int]]:
        backend = await loaded(EngineBackend(_options(checkpoint, max_batch=1, prefix_cache_tokens=0), ENCODING))
        answers = [await _answer(backend, prompt, count, None) for prompt, count, _ in _load()]
        await backend.aclose()
        return answers

    return asyncio.run(answers())


async def _together(checkpoint: Path, spread: random.Random | None):
    """The load at once (spread None), or its requests spread over 0.3 s from two tenants, every third request in
    the priority tier; (answers, the engine's stats, each pool's reference counts) once all is done."""
    options = _options(checkpoint, max_batch=6, kv_cache_tokens=160, page_size=16, prefill_chunk=16)
    backend = await loaded(EngineBackend(options, ENCODING))

    async def request(index: int, prompt: list[int], count: int, closed: int | None) -> list[int]:
        if spread is None:
            return await _answer(backend, prompt, count, closed)
        await asyncio.sleep(spread.random() * 0.3)
        tier: SchedulingTier = "priority" if index % 3 == 0 else "default"
        return await _answer(backend, prompt, count, closed, tenant="ab"[index % 2], tier=tier)

    answers = await asyncio.gather(*(request(index, *entry) for index, entry in enumerate(_load())))
    await asyncio.sleep(0.1)  # the engine thread's bookkeeping after the last token
    batcher = backend._batcher
    assert batcher is not None
    stats = backend.engine_stats()
    pools = batcher.pools
    counts = {name: list(pool._refs) for name, pool in (("full", pools.full), ("window", pools.window))}
    await backend.aclose()
    return answers, stats, counts


def _check(answers: list[list[int]], alone: list[list[int]], stats, counts) -> None:
    for (prompt, _, closed), got, solo in zip(_load(), answers, alone, strict=True):
        assert got == (solo[:closed] if closed else solo), f"a prompt of {len(prompt)} tokens"
    assert (stats.running, stats.waiting, stats.kv_tokens) == (0, 0, 0)
    for name, pool in stats.kv_pages.items():
        assert pool.in_use == 0 and pool.cached + pool.free == pool.pages, name
        assert not any(counts[name]), f"{name}: pages still referenced"


def test_sharing_copying_eviction_and_preemption_together_keep_every_answer_and_every_page(checkpoint, alone):
    answers, stats, counts = asyncio.run(_together(checkpoint, None))
    _check(answers, alone, stats, counts)
    assert stats.preemptions > 0 and stats.prefix_hit_tokens > 0 and stats.prefix_evicted_blocks > 0


def test_arrivals_spread_over_time_from_two_tenants_and_tiers_keep_every_answer(checkpoint, alone):
    """Preemptions then fall anywhere: on a prompt's fill run again (it runs again whole), on a row a later row's
    room preempts in the same step (it leaves the step), on a prompt taking pages named since it was admitted."""
    preemptions = 0
    for seed in range(6):
        answers, stats, counts = asyncio.run(_together(checkpoint, random.Random(seed)))
        _check(answers, alone, stats, counts)
        preemptions += stats.preemptions
    assert preemptions > 0


def _pressing_load(seed: int) -> list[tuple[int, str, list[int], int]]:
    """(the iteration it arrives at, tenant, prompt, new tokens) for four requests of two tenants, their prompts
    sharing prefixes of three families."""
    rng = np.random.default_rng(seed)
    families = [rng.integers(1000, 190_000, 120).tolist() for _ in range(3)]
    load = []
    for index in range(4):
        family = families[int(rng.integers(0, 3))]
        prompt = family[: int(rng.integers(0, 100))] + rng.integers(1000, 190_000, int(rng.integers(5, 40))).tolist()
        load.append((int(rng.integers(0, 60)), "ab"[index % 2], prompt[:120], int(rng.integers(10, 60))))
    return load


def test_answers_that_cannot_all_grow_do_not_trade_places_forever(checkpoint):
    """A schedule replayed iteration by iteration, with no engine thread and no timing: four requests of two tenants
    level in their shares, into 13 pages of 16 positions. Two answers came to need a page each at once with none
    left: the one whose tenant was ahead was preempted, placed again at once from the pages the cache kept (its last
    token run again, its tenant charged for it, and so ahead of the other), and they traded places so at every
    iteration, neither writing a token. A sequence is placed only where the running answers' next pages are left
    too, so each placement is followed by a step in which they run: every answer ends."""
    model = compiled_model(Checkpoint(checkpoint), GraphOptions(192, page_size=16), checkpoint.parent / "graphs")
    full, window, page = 13, 71, 16
    runtime = DecoderRuntime(str(model), tiny_config(), 7, 192, full, window, page, kernels=kernel_library())
    pools = KvPools(full, window, page, tiny_config().sliding_window)
    batcher = Batcher(runtime, pools, 6, prefill_chunk=16, prefix_budget=4 * full * page, thread=False)
    load = _pressing_load(176)
    ended: list[int] = []

    def emit(index: int) -> Callable[[Chunk | BaseException | None], None]:
        def take(item: Chunk | BaseException | None) -> None:
            assert not isinstance(item, BaseException), item
            if item is None:
                ended.append(index)

        return take

    for iteration in range(1000):
        for index, (arrives, tenant, prompt, count) in enumerate(load):
            if arrives == iteration:
                request = GenerateRequest(prompt, count, (), f"r{index}", GREEDY, tenant=tenant)
                batcher.submit(Sequence(request, emit(index), np.random.default_rng(index)))
        if len(ended) == len(load):
            break
        if batcher.active or batcher.load().waiting:  # with nothing to do, an iteration waits for an arrival
            assert batcher.serve_once()
    assert sorted(ended) == [0, 1, 2, 3], f"after {iteration} iterations, {batcher.stats().preemptions} preemptions"
    assert 0 < batcher.stats().preemptions < 10
