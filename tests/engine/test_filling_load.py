"""What an engine says of its load for the gateway's routers (`engine_load()`, pushed on the engine server's event
stream): the prompt tokens its sequences have left to run before their first tokens, going down as a long prompt's
pieces run and none once it answers; and a request's arrival and end wake the stream at once."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling
from backends.engine.backend import EngineBackend, EngineOptions
from harmony import load_harmony_encoding

HEADER = [200006, 17360, 200008]  # <|start|>user<|message|>
PROMPT = 6000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("filling") / "model", tiny_config(), "original")


def test_the_prompt_tokens_left_to_run_go_down_as_a_long_prompt_fills(checkpoint, tmp_path):
    prompt = [*HEADER, *((i * 104_729) % 50_000 + 100 for i in range(PROMPT))]
    request = GenerateRequest(prompt, 4, (), "long", sampling=Sampling(temperature=0), tenant="a")
    options = EngineOptions(
        checkpoint=str(checkpoint), max_batch=4, max_positions=8192, prefill_chunk=8192, prefill_piece_ms=5.0,
        prefix_cache_tokens=0, cache_dir=str(tmp_path),
    )  # fmt: skip

    async def scenario() -> tuple[list[tuple[int, int]], int]:
        engine = await loaded(EngineBackend(options, load_harmony_encoding()))
        try:
            idle = engine.engine_load()
            assert idle == (0, 0, 0, 0)
            seen: list[tuple[int, int]] = []  # (prompt tokens left, prefill tokens run) while it fills
            answered = asyncio.Event()

            async def run() -> None:
                async for _ in engine.generate(request):
                    answered.set()

            task = asyncio.ensure_future(run())
            started = engine.engine_stats().prefill_tokens
            deadline = time.monotonic() + 60
            while not answered.is_set() and time.monotonic() < deadline:
                seen.append((engine.engine_load().filling, engine.engine_stats().prefill_tokens - started))
                await asyncio.sleep(0.001)
            await task
            return seen, engine.engine_load().filling
        finally:
            await engine.aclose()

    seen, after = asyncio.run(scenario())
    total = len(prompt)
    counted = [(left, run) for left, run in seen if left]
    assert counted and all(left <= total for left, _ in counted)
    assert max(left for left, _ in counted) > total // 2  # seen before most of it ran
    lefts = [left for left, _ in counted]
    assert lefts == sorted(lefts, reverse=True) and len(set(lefts)) >= 3  # going down, piece by piece
    # what is left and what has run make up the prompt (run counted a step before `left` is: at most a piece over)
    assert all(left + run >= total for left, run in counted)
    assert after == 0


def test_a_request_arriving_or_ending_wakes_the_load_s_watchers_at_once(checkpoint, tmp_path):
    """What the engine server's event stream waits on between looks: set when a request is submitted (the load then
    already counts it, prompt tokens and all) and when it ends, so that other replicas' routers see it before they
    choose again rather than at the stream's next look."""
    options = EngineOptions(checkpoint=str(checkpoint), max_batch=2, max_positions=4096, cache_dir=str(tmp_path))
    request = GenerateRequest([*HEADER, *range(1000, 1100)], 2, (), "r", sampling=Sampling(temperature=0), tenant="a")

    async def scenario() -> tuple[object, bool]:
        engine = await loaded(EngineBackend(options, load_harmony_encoding()))
        changed = engine.watch_load()
        try:
            generation = engine.generate(request)
            first = asyncio.ensure_future(anext(generation))
            await asyncio.wait_for(changed.wait(), 5)
            at_arrival = engine.engine_load()
            await first
            changed.clear()
            async for _ in generation:
                pass
            ended = changed.is_set()
            engine.unwatch_load(changed)
            changed.clear()
            async for _ in engine.generate(request):
                pass
            return at_arrival, ended and not changed.is_set()
        finally:
            await engine.aclose()

    at_arrival, woken_at_the_end = asyncio.run(scenario())
    assert at_arrival.running + at_arrival.waiting == 1 and at_arrival.filling > 0 and at_arrival.filling_prompts == 1
    assert woken_at_the_end
