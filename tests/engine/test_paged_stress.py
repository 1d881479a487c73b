"""The paged engine under a load that makes it share, copy, evict and preempt at once: prompts from four families
sharing prefixes, of 5 to 120 tokens, some streams closed early, through a pool of ten pages of 16 positions for
six sequences. Every answer that runs to its end is the one its prompt gets alone in an engine with room and no
prefix cache, and once all is done no page is held: each is free or cached, its reference count zero."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling
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


async def _answer(backend: EngineBackend, prompt: list[int], count: int, closed: int | None) -> list[int]:
    tokens: list[int] = []
    stream = backend.generate(GenerateRequest(prompt, count, (), "stress", GREEDY, tenant="t"))
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


def test_sharing_copying_eviction_and_preemption_together_keep_every_answer_and_every_page(checkpoint):
    load = _load()

    async def alone() -> list[list[int]]:
        backend = await loaded(EngineBackend(_options(checkpoint, max_batch=1, prefix_cache_tokens=0), ENCODING))
        answers = [await _answer(backend, prompt, count, None) for prompt, count, _ in load]
        await backend.aclose()
        return answers

    async def together():
        options = _options(checkpoint, max_batch=6, kv_cache_tokens=160, page_size=16, prefill_chunk=16)
        backend = await loaded(EngineBackend(options, ENCODING))
        answers = await asyncio.gather(*(_answer(backend, *request) for request in load))
        await asyncio.sleep(0.1)  # the engine thread's bookkeeping after the last token
        batcher = backend._batcher
        assert batcher is not None
        stats = backend.engine_stats()
        pools = batcher.pools
        counts = {name: list(pool._refs) for name, pool in (("full", pools.full), ("window", pools.window))}
        await backend.aclose()
        return answers, stats, counts

    expected = asyncio.run(alone())
    answers, stats, counts = asyncio.run(together())
    for (prompt, _, closed), got, solo in zip(load, answers, expected, strict=True):
        assert got == (solo[:closed] if closed else solo), f"a prompt of {len(prompt)} tokens"
    assert stats.preemptions > 0 and stats.prefix_hit_tokens > 0 and stats.prefix_evicted_blocks > 0
    assert (stats.running, stats.waiting, stats.kv_tokens) == (0, 0, 0)
    for name, pool in stats.kv_pages.items():
        assert pool.in_use == 0 and pool.cached + pool.free == pool.pages, name
        assert not any(counts[name]), f"{name}: pages still referenced"
