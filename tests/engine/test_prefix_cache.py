"""Prefix reuse in the engine: a prompt that starts the way an earlier one did (same tenant, same cache key)
prefills only the rest, and the answer is the one a full prefill gives; running sequences are never
disturbed by others sharing their pages, copying from them or evicting cached ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from batcher_replay import Arrival, replay, replaying_batcher
from engine_fixtures import REAL_WIDTH, loaded, make_checkpoint, tiny_config

from backends.base import EngineStats, GenerateRequest, Sampling
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.page_pool import KvPools, PageTable
from backends.engine.prefix_cache import PrefixCache, Written
from backends.page_names import namespace_of
from harmony import load_harmony_encoding

ENCODING = load_harmony_encoding()
GREEDY = Sampling(temperature=0)
BLOCK = 16
SHARED = [200006, 17360, 200008, *range(3000, 3000 + 150)]  # a system prompt many requests start with


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("prefix") / "model", tiny_config(), "hf")


def _backend(checkpoint: Path, **extra) -> EngineBackend:
    options = EngineOptions(
        checkpoint=str(checkpoint),
        max_positions=512,
        cache_dir=str(checkpoint.parent / "graphs"),
        prefill_chunk=48,
        page_size=BLOCK,
        **extra,
    )
    return EngineBackend(options, ENCODING)


async def _generate(backend, prompt, count=12, tenant="a", key=None) -> tuple[list[int], int]:
    """(greedy tokens, prompt tokens the engine reused)."""
    tokens, cached = [], -1
    request = GenerateRequest(prompt, count, (), "t", GREEDY, cache_key=key, tenant=tenant)
    async for chunk in backend.generate(request):
        tokens += chunk.tokens
        if chunk.cached_tokens is not None:
            cached = chunk.cached_tokens
    return tokens, cached


async def _settled(backend: EngineBackend) -> EngineStats:
    await asyncio.sleep(0.05)  # the engine thread's bookkeeping after the last token
    stats = backend.engine_stats()
    assert stats is not None
    return stats


def _conversation() -> list[list[int]]:
    """A growing dialog: each prompt is the previous one plus some new tokens."""
    first = [*SHARED, *range(5000, 5040)]
    second = [*first, *range(6000, 6070)]
    return [first, first, second, [*second, *range(7000, 7033)]]


def test_reuse_gives_exactly_the_tokens_a_full_prefill_gives(checkpoint):
    prompts = _conversation()

    async def run(budget: int | None) -> tuple[list[tuple[list[int], int]], EngineStats]:
        backend = await loaded(_backend(checkpoint, max_batch=2, prefix_cache_tokens=budget))
        results = [await _generate(backend, prompt) for prompt in prompts]
        stats = await _settled(backend)
        await backend.aclose()
        return results, stats

    reused, with_stats = asyncio.run(run(None))
    fresh, without_stats = asyncio.run(run(0))
    assert [tokens for tokens, _ in reused] == [tokens for tokens, _ in fresh]
    assert [cached for _, cached in fresh] == [0, 0, 0, 0]
    cached = [cached for _, cached in reused]
    # the first prompt runs whole; its repeat keeps all but its last token (run again for its logits); a
    # continuation reuses all of what came before, up to where it differs from what the earlier sequence went on
    # to write (its last page copied up to there)
    assert cached[0] == 0
    assert cached[1] == len(prompts[1]) - 1
    assert cached[2] == len(prompts[1])
    assert cached[3] == len(prompts[2])
    total = sum(len(prompt) for prompt in prompts)
    assert with_stats.prefix_lookup_tokens == total == without_stats.prefix_lookup_tokens
    assert with_stats.prefix_hit_tokens == sum(cached)
    assert with_stats.prefill_tokens == total - sum(cached)
    assert without_stats.prefill_tokens == total and without_stats.prefix_hit_tokens == 0


def test_a_prompt_is_reused_only_in_its_own_tenant_and_cache_key(checkpoint):
    prompt = SHARED[:33]  # short: every position of it weighs on the answer

    async def scenario() -> list[tuple[list[int], int]]:
        backend = await loaded(_backend(checkpoint, max_batch=3))
        results = [
            await _generate(backend, prompt, tenant="a"),
            await _generate(backend, prompt, tenant="b"),  # another tenant: nothing
            await _generate(backend, prompt, tenant="a", key="session-1"),  # another cache key: nothing
            await _generate(backend, prompt, tenant="a"),
            await _generate(backend, prompt, tenant="b"),
        ]
        await backend.aclose()
        return results

    results = asyncio.run(scenario())
    hit = len(prompt) - 1
    assert [cached for _, cached in results] == [0, 0, 0, hit, hit]
    # b and the session ran while a's pages were cached: they came through intact
    assert all(tokens == results[0][0] for tokens, _ in results)


def test_an_operator_may_share_the_cache_across_tenants(checkpoint):
    prompt = _conversation()[0]

    async def scenario() -> list[int]:
        backend = await loaded(_backend(checkpoint, max_batch=2, prefix_cache_scope="shared"))
        cached = [(await _generate(backend, prompt, tenant=tenant))[1] for tenant in ("a", "b")]
        await backend.aclose()
        return cached

    assert asyncio.run(scenario()) == [0, len(prompt) - 1]


def test_a_running_sequences_pages_are_shared_with_another_and_both_answers_stay_exact(checkpoint):
    first, second = [*SHARED, *range(5000, 5030)], [*SHARED, *range(8000, 8045)]

    async def scenario() -> tuple[list[list[int]], list[list[int]], list[int], EngineStats]:
        backend = await loaded(_backend(checkpoint, max_batch=3, prefix_cache_tokens=0))
        solo = [(await _generate(backend, prompt, 40))[0] for prompt in (first, second)]
        await backend.aclose()
        backend = await loaded(_backend(checkpoint, max_batch=3))
        running = asyncio.create_task(_generate(backend, first, 40))
        while (await _settled(backend)).decode_tokens < 5:
            await asyncio.sleep(0.005)  # the first decodes; its prompt's pages are named
        copied = await _generate(backend, second, 40)
        together = [(await running)[0], copied[0]]
        stats = await _settled(backend)
        await backend.aclose()
        return solo, together, [copied[1]], stats

    solo, together, cached, stats = asyncio.run(scenario())
    assert together == solo
    assert cached == [len(SHARED)]  # the pages by reference, then a copy of the part of the next the two share
    assert stats.prefix_hit_tokens == cached[0]


def test_prompts_arriving_together_on_a_new_prefix_prefill_it_once(checkpoint):
    """Three users send a system prompt nothing holds yet, at once: the first admitted prefills it, the other two
    take its pages when their own turn to prefill comes, and every answer is the one a full prefill gives."""
    shared = [*SHARED, *range(20000, 20200)]  # 353 tokens: eight pieces of 48 before the second could start
    prompts = [[*shared, *range(base, base + 20)] for base in (30000, 31000, 32000)]

    async def scenario(budget: int | None) -> tuple[list[tuple[list[int], int]], EngineStats]:
        backend = await loaded(_backend(checkpoint, max_batch=3, prefix_cache_tokens=budget))
        answers = await asyncio.gather(*(_generate(backend, prompt, 12) for prompt in prompts))
        stats = await _settled(backend)
        await backend.aclose()
        return list(answers), stats

    fresh, _ = asyncio.run(scenario(0))
    together, stats = asyncio.run(scenario(None))
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in fresh]
    cached = sorted(cached for _, cached in together)
    # full pages by reference, then a copy of the part of the next page the prompts share
    assert cached == [0, len(shared), len(shared)]
    assert stats.prefix_hit_tokens == 2 * len(shared)
    assert stats.prefill_tokens == sum(len(prompt) for prompt in prompts) - 2 * len(shared)


@pytest.fixture(scope="module")
def real_width_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("prefix_wide") / "model", REAL_WIDTH, "original")


@pytest.mark.parametrize("width", ["tiny", "real width"])
def test_a_prompt_overtaken_halfway_goes_on_from_where_the_other_got(width, request):
    """A shared prompt sent ahead to warm the engine (the prefix alone, one token, flex tier) has run a piece when a
    request on it arrives at the default tier, which overtakes it: the request starts from the pages the warm-up
    named, and runs the rest of the prefix; the warm-up's next piece takes those and runs only its last token (it
    ran the prefix again before). The prefix runs once, and the request's answer is the one a full prefill gives;
    also at gpt-oss's width (hidden 2880, vocabulary 201,088). Replayed iteration by iteration (no engine thread)."""
    checkpoint = request.getfixturevalue("checkpoint" if width == "tiny" else "real_width_checkpoint")
    shared = SHARED[:96]  # six pages
    asked = GenerateRequest([*shared, *range(30000, 30020)], 12, (), "r", GREEDY, tenant="a")
    warm_up = GenerateRequest(shared, 1, (), "w", GREEDY, tenant="a", tier="flex")
    options = EngineOptions(checkpoint=str(checkpoint), max_positions=192, cache_dir=str(checkpoint.parent / "graphs"),
                            max_batch=2, page_size=BLOCK, prefill_chunk=BLOCK)  # fmt: skip
    alone = [Arrival(0, asked)]
    replay(replaying_batcher(checkpoint, options.model_copy(update={"prefix_cache_tokens": 0})), alone)
    batcher = replaying_batcher(checkpoint, options)
    arrivals = [Arrival(0, warm_up), Arrival(2, asked)]
    assert replay(batcher, arrivals) == {0: "done", 1: "done"}
    warmed, answered = arrivals
    assert answered.tokens == alone[0].tokens and answered.cached == 2 * BLOCK  # the warm-up's two pieces
    assert warmed.cached == len(shared) - 1 - 2 * BLOCK  # the rest, but for its last token
    assert batcher.stats().prefill_tokens == len(asked.prompt) + 1


def test_eviction_under_a_small_budget_never_breaks_a_running_sequence(checkpoint):
    prompts = [[*SHARED[:40], *range(base, base + 60)] for base in (10000, 11000, 12000, 13000, 14000, 15000)]

    async def scenario(budget: int) -> tuple[list[list[int]], EngineStats]:
        backend = await loaded(_backend(checkpoint, max_batch=2, prefix_cache_tokens=budget))
        answers = await asyncio.gather(*(_generate(backend, prompt, 30) for prompt in prompts * 2))
        stats = await _settled(backend)
        await backend.aclose()
        return [tokens for tokens, _ in answers], stats

    alone, _ = asyncio.run(scenario(0))
    squeezed, stats = asyncio.run(scenario(2 * BLOCK))
    assert squeezed == alone  # 12 requests, 2 at a time, pages reused and taken back under them
    assert stats.prefix_evicted_blocks > 0 and stats.prefix_hit_tokens > 0
    assert stats.prefix_blocks <= 2 * (512 // BLOCK)


def _written(cache: PrefixCache, pools: KvPools, space: bytes, prompt: list[int]) -> PageTable:
    """A sequence that wrote `prompt` into fresh pages (its window ring trimmed as it went) and finished."""
    table, written = PageTable(), Written()
    pools.extend(table, 0, len(prompt))
    cache.extend(space, table, written, prompt)
    pools.trim(table, len(prompt), cache.named_window)
    cache.keep_tail(space, table, written)
    pools.release(table, cache.named_full, cache.named_window)
    cache.fit_budget()
    return table


def test_cached_pages_stay_within_the_budget_least_recently_used_first():
    space = namespace_of("tenant", None, shared=False)
    pools = KvPools(full_pages=20, window_pages=20, page_size=4, window=8)
    cache = PrefixCache(pools, budget=16)  # four pages of each pool
    prompts = [list(range(base, base + 10)) for base in (100, 200, 300)]
    for prompt in prompts:
        _written(cache, pools, space, prompt)  # two full pages and a tail page each
    assert pools.full.stats().cached == 4 and cache.stats().evicted_blocks == 4
    blocks, tail, reused = cache.lookup(space, prompts[2])
    assert (len(blocks), reused) == (2, 9) and tail is not None  # the newest: its pages and a copy of its tail
    assert cache.lookup(space, prompts[0])[2] == 0  # the oldest went first
    assert cache.lookup(namespace_of("other", None, shared=False), prompts[2])[2] == 0  # another namespace


def test_a_prefix_is_reused_only_as_far_as_its_window_pages_are_kept():
    """A long prompt's early window pages are given back as it goes: a later prompt that shares only its start
    cannot start there (its first token would read window pages no longer kept), one sharing it all can."""
    space = namespace_of("tenant", None, shared=False)
    pools = KvPools(full_pages=40, window_pages=40, page_size=4, window=8)
    cache = PrefixCache(pools, budget=160)
    prompt = list(range(100, 140))  # 10 pages; the window reaches back two
    _written(cache, pools, space, prompt)
    for _ in range(8):  # the early window pages, cached, are taken for other sequences
        pools.window.evict_oldest()
    assert cache.lookup(space, [*prompt[:16], 7, 7, 7])[2] == 0
    blocks, _, reused = cache.lookup(space, [*prompt, 7])
    assert reused == 40 and len(blocks) == 10
