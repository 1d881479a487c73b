"""The paged engine under a load that makes it share, copy, evict and preempt at once: prompts from four families
sharing prefixes, of 5 to 120 tokens, some streams closed early, through a pool of ten pages of 16 positions for
six sequences, arriving at once or spread over 0.3 s from two tenants in two tiers. Every answer that runs to its
end is the one its prompt gets alone in an engine with room and no prefix cache, and once all is done no page is
held: each is free or cached, its reference count zero."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
from batcher_replay import Arrival, replay, replaying_batcher
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling, SchedulingTier
from backends.engine.backend import EngineBackend, EngineOptions
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


def _families(rng: np.random.Generator) -> list[list[int]]:
    return [rng.integers(1000, 190_000, 120).tolist() for _ in range(3)]


def _prompt(rng: np.random.Generator, families: list[list[int]]) -> list[int]:
    """Up to 120 tokens: a leading part of one of the families, then tokens of its own."""
    family = families[int(rng.integers(0, 3))]
    return (family[: int(rng.integers(0, 100))] + rng.integers(1000, 190_000, int(rng.integers(5, 40))).tolist())[:120]


def test_answers_that_cannot_all_grow_do_not_trade_places_forever(checkpoint):
    """A schedule replayed iteration by iteration, with no engine thread and no timing: four requests of two tenants
    level in their shares, into 13 pages of 16 positions. Two answers came to need a page each at once with none
    left: the one whose tenant was ahead was preempted, placed again at once from the pages the cache kept (its last
    token run again, its tenant charged for it, and so ahead of the other), and they traded places so at every
    iteration, neither writing a token. A sequence is placed only where the running answers' next pages are left
    too, so each placement is followed by a step in which they run: every answer ends."""
    options = _options(checkpoint, max_batch=6, kv_cache_tokens=160, page_size=16, prefill_chunk=16)
    batcher = replaying_batcher(checkpoint, options)
    rng = np.random.default_rng(552)
    families = _families(rng)
    arrivals = []
    for index in range(4):
        prompt = _prompt(rng, families)
        at, count = int(rng.integers(0, 60)), int(rng.integers(10, 60))
        arrivals.append(Arrival(at, GenerateRequest(prompt, count, (), f"r{index}", GREEDY, tenant="ab"[index % 2])))
    ended = replay(batcher, arrivals)
    assert ended == dict.fromkeys(range(4), "done"), f"{batcher.stats().preemptions} preemptions"
    assert 0 < batcher.stats().preemptions < 10


@pytest.mark.parametrize("seed", range(3))
def test_random_schedules_end_every_request_and_give_back_every_page(checkpoint, seed):
    """Schedules replayed iteration by iteration on pools sized as the engine sizes them: two to nine requests of
    three tenants with weights, in three tiers, some clients going away, batches of one to six; every request
    ends (done, or cancelled where its client went), and no page is held once all have."""
    rng = np.random.default_rng(seed)
    pressed = 0
    for _ in range(8):
        options = _options(
            checkpoint,
            max_batch=int(rng.integers(1, 7)),
            kv_cache_tokens=int(rng.choice([160, 192, 256, 400])),
            page_size=16,
            prefill_chunk=int(rng.choice([16, 32, 64])),
        )
        batcher = replaying_batcher(checkpoint, options)
        families = _families(rng)
        arrivals = []
        for index in range(int(rng.integers(2, 10))):
            request = GenerateRequest(
                _prompt(rng, families),
                int(rng.integers(1, 60)),
                (),
                f"r{index}",
                GREEDY,
                tenant=str(rng.choice(["a", "b", "c"])),
                weight=float(rng.choice([0.5, 1.0, 1.0, 2.0])),
                tier=str(rng.choice(["default", "default", "priority", "flex"])),  # type: ignore[arg-type]
            )
            cancel_after = int(rng.integers(1, 40)) if rng.random() < 0.2 else None
            arrivals.append(Arrival(int(rng.integers(0, 60)), request, cancel_after))
        ended = replay(batcher, arrivals, iterations=3000)
        assert len(ended) == len(arrivals), f"{options}: {batcher.stats().preemptions} preemptions, {ended}"
        for index, arrival in enumerate(arrivals):
            assert ended[index] in ({"done", "cancelled"} if arrival.cancel_after else {"done"}), ended[index]
        for pool in (batcher.pools.full, batcher.pools.window):
            assert not any(pool._refs), "pages still referenced"
        pressed += batcher.stats().preemptions > 0
    assert pressed > 0  # the pools ran short somewhere
