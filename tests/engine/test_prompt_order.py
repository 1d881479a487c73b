"""Of one tenant's prompts filling at once, the one with the least left goes first: a conversation's short turn (its
prefix in the cache) does not wait for another prompt's whole fill, and a long prompt is overtaken for at most about
its own length however many short ones keep coming. Measured in the engine's prefill tokens (its own count of prompt
tokens run) as each answer's first token arrives."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling
from backends.engine.backend import EngineBackend, EngineOptions
from harmony import load_harmony_encoding

HEADER = [200006, 17360, 200008]  # <|start|>user<|message|>


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("order") / "model", tiny_config(), "original")


def _request(name: str, prompt_tokens: int, output: int, seed: int) -> GenerateRequest:
    prompt = [*HEADER, *((seed * 7919 + i * 104_729) % 50_000 + 100 for i in range(prompt_tokens))]
    return GenerateRequest(prompt, output, (), name, sampling=Sampling(temperature=0), tenant="a")


def _engine(checkpoint, tmp_path) -> EngineBackend:
    """Pieces of 5 ms, and no prefix reuse (a prompt sent again runs whole)."""
    options = EngineOptions(
        checkpoint=str(checkpoint), max_batch=4, max_positions=8192, prefill_chunk=8192, prefill_piece_ms=5.0,
        prefix_cache_tokens=0, cache_dir=str(tmp_path),
    )  # fmt: skip
    return EngineBackend(options, load_harmony_encoding())


async def _run(engine: EngineBackend, long: GenerateRequest, later: list[GenerateRequest]) -> dict[str, object]:
    """`long` first; once its pieces run, every one of `later` at once. Per request: the engine's prefill tokens when
    its first token came (`NAME`), and its tokens (`NAME:tokens`)."""
    seen: dict[str, object] = {}

    async def run(request: GenerateRequest) -> None:
        tokens: list[int] = []
        async for chunk in engine.generate(request):
            if not tokens:
                seen[request.request_id] = engine.engine_stats().prefill_tokens
            tokens.extend(chunk.tokens)
        seen[f"{request.request_id}:tokens"] = tokens

    first = asyncio.ensure_future(run(long))
    started = time.monotonic()
    while engine.engine_stats().prefill_tokens == 0 and time.monotonic() - started < 30:
        await asyncio.sleep(0.001)  # the long prompt's pieces are running
    await asyncio.gather(first, *(run(request) for request in later))
    return seen


def test_a_short_prompt_goes_before_the_rest_of_a_long_one_of_its_tenant(checkpoint, tmp_path):
    """A tenant's 6,000-token prompt runs in pieces of 5 ms; the same tenant's 20-token prompt, sent meanwhile, gets
    its first token before the long prompt's fill ends (first come, first filled: after all 6,003 of its tokens), and
    the long prompt's answer is the same as alone."""
    long = _request("long", 6000, 4, seed=1)

    async def scenario() -> tuple[dict[str, object], dict[str, object]]:
        engine = await loaded(_engine(checkpoint, tmp_path))
        try:
            alone = await _run(engine, long, [])
            both = await _run(engine, long, [_request("short", 20, 2, seed=3)])  # no prefix reuse: all again
        finally:
            await engine.aclose()
        return alone, both

    alone, both = asyncio.run(scenario())
    start = alone["long"]  # the prefill tokens the first run left behind
    assert both["short"] < start + 6003, (both["short"], start)  # before the long prompt's fill ended
    assert both["long"] >= start + 6003 + 23
    assert both["long:tokens"] == alone["long:tokens"] and len(both["short:tokens"]) == 2


def test_a_long_prompt_is_overtaken_for_at_most_about_its_own_length(checkpoint, tmp_path):
    """A tenant's 1,500-token prompt, then 150 of its 20-token prompts at once: some of them go first, but the long
    prompt's first token comes by the time the engine has run about twice its length (its own 1,503 tokens and at
    most about as many of the others', not all 3,450 of theirs), and every short prompt is answered."""
    shorts = [_request(f"short-{i}", 20, 1, seed=10 + i) for i in range(150)]

    async def scenario() -> dict[str, object]:
        engine = await loaded(_engine(checkpoint, tmp_path))
        try:
            return await _run(engine, _request("long", 1500, 2, seed=4), shorts)
        finally:
            await engine.aclose()

    seen = asyncio.run(scenario())
    overtook = [s.request_id for s in shorts if seen[s.request_id] < seen["long"]]
    assert overtook, "no short prompt went before the long one: the order was first come, first filled"
    assert seen["long"] <= 2 * 1503 + 2 * 23, seen["long"]
    assert len(overtook) < len(shorts), "every short prompt went first: the long one waited for all of them"
    assert all(len(seen[f"{s.request_id}:tokens"]) == 1 for s in shorts)
