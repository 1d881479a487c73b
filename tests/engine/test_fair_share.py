"""Tenants share the engine fairly: one tenant's backlog does not hold another's first token behind it, a tenant
alone still gets the whole batch, and weights set the shares."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import TIER_RANK, GenerateRequest, Sampling, SchedulingTier
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.fair_share import ARRIVAL_EDGE, FairShare
from harmony import load_harmony_encoding


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("fair") / "model", tiny_config(), "original")


def _engine(checkpoint, tmp_path, **options) -> EngineBackend:
    settings = {"max_batch": 2, "max_positions": 2048, "prefill_chunk": 32, "cache_dir": str(tmp_path), **options}
    return EngineBackend(EngineOptions(checkpoint=str(checkpoint), **settings), load_harmony_encoding())


def _request(
    tenant: str, index: int, prompt_tokens: int, output: int, weight: float = 1.0, tier: SchedulingTier = "default"
) -> GenerateRequest:
    prompt = [200006, 17360, 200008, *((index * 7919 + i) % 50_000 for i in range(prompt_tokens))]
    return GenerateRequest(prompt, output, (), f"{tenant}-{index}", sampling=Sampling(temperature=0), tenant=tenant,
                           weight=weight, tier=tier)  # fmt: skip


async def _first_tokens(
    engine: EngineBackend, requests: list[tuple[float | None, GenerateRequest]]
) -> dict[str, float]:
    """When each request got its first token and its last, from the start, the requests sent at their delays (None:
    as the first token of any comes, the others running and queued then, on a machine of any speed); `:sent` keys
    say when those were sent."""
    started = time.monotonic()
    firsts: dict[str, float] = {}
    first_token = asyncio.Event()

    async def run(delay: float | None, request: GenerateRequest) -> None:
        if delay is None:
            await first_token.wait()
            firsts[request.request_id + ":sent"] = time.monotonic() - started
        else:
            await asyncio.sleep(delay)
        async for _ in engine.generate(request):
            first_token.set()
            firsts.setdefault(request.request_id, time.monotonic() - started)
        firsts[request.request_id + ":done"] = time.monotonic() - started

    await asyncio.gather(*(run(delay, request) for delay, request in requests))
    return firsts


def test_a_tenant_s_backlog_does_not_hold_another_tenant_s_first_token_behind_it(checkpoint, tmp_path):
    """Tenant A queues twelve long prompts on a batch of two; tenant B's short request, sent after them, takes a
    slot from A (above its share) and gets its first token before A's later requests get theirs, long before A's
    backlog drains (in arrival order it would come last). B is sent as A's first token comes (at a fixed 0.3 s, a
    Zen 5 core had run A's first four by then)."""

    async def scenario() -> dict[str, float]:
        engine = await loaded(_engine(checkpoint, tmp_path))
        try:
            flood = [(0.0, _request("a", i, 800, 64)) for i in range(12)]
            return await _first_tokens(engine, [*flood, (None, _request("b", 0, 20, 4))])
        finally:
            await engine.aclose()

    times = asyncio.run(scenario())
    sent_b = times["b-0:sent"]
    later_a = sorted(times[f"a-{i}"] for i in range(12))[4:]  # A's requests beyond the first four to start
    drain = max(times[f"a-{i}:done"] for i in range(12))
    assert sent_b < later_a[0], "A's backlog drained before B came: the scenario measured nothing"
    assert times["b-0"] < later_a[0], (times["b-0"], later_a)
    assert times["b-0"] - sent_b < (drain - sent_b) / 5, (times["b-0"], drain)


def test_a_tenant_alone_gets_the_whole_batch_and_weights_set_the_shares():
    """FairShare itself: a lone tenant claims nothing from itself; of two tenants weighted 3 and 1 on a batch of
    four, the lighter one below its share takes a slot from the heavier only while the heavier runs more than
    three; virtual time grows by tokens over weight."""

    class Seq:
        def __init__(self, tenant: str, weight: float, admitted: int = 0) -> None:
            self.tenant, self.weight, self.admitted, self.arrived, self.rank = tenant, weight, admitted, 0, 1
            self.position = 0

    share = FairShare()
    running = [Seq("a", 3.0, i) for i in range(4)]
    for sequence in running:
        share.charge(sequence, 30)
    share.push(Seq("a", 3.0), running)
    assert share.claim(running, 4) is None  # alone: nothing to take from anyone
    light = Seq("b", 1.0)
    share.push(light, running)
    assert share.vtime("a") - share.vtime("b") == pytest.approx(ARRIVAL_EDGE)  # idle, it banked nothing: level
    assert share.head() is light  # with the least served, first on the tie
    claim = share.claim(running, 4)
    assert claim is not None and claim[0] is light and claim[1] is running[-1]  # a's latest admitted
    for sequence, written in zip(running, (300, 10, 200, 400), strict=True):
        sequence.position = written
    assert share.claim(running, 4)[1] is running[1]  # the one that wrote least: the least work is run again
    for sequence in running:
        sequence.position = 0
    three = running[:3]
    assert share.claim([*three, light], 4) is None  # a at its share (3 of 4), b at its (1): nobody moves
    share.charge(light, 10)
    assert (
        share.vtime("b") == pytest.approx(50.0 - ARRIVAL_EDGE) and share.head().tenant == "a"
    )  # b ran 10 tokens at weight 1: now ahead
    assert share.victim([*three, light]).tenant == "b"  # pages short: the tenant furthest ahead gives one back


@pytest.mark.parametrize(("flood", "later"), [("flex", "default"), ("default", "priority")])
def test_a_better_service_tier_runs_ahead_of_a_worse_one_of_the_same_tenant(checkpoint, tmp_path, flood, later):
    """One tenant queues twelve long prompts at one tier, then one short request at a better tier: it takes a slot
    from the worse tier's running sequences and gets its first token before the flood's later requests (within
    one tenant, the fair share alone would keep arrival order and serve it last). It is sent as the flood's first
    token comes."""

    async def scenario() -> dict[str, float]:
        engine = await loaded(_engine(checkpoint, tmp_path))
        try:
            backlog = [(0.0, _request("a", i, 800, 64, tier=flood)) for i in range(12)]
            return await _first_tokens(engine, [*backlog, (None, _request("a", 99, 20, 4, tier=later))])
        finally:
            await engine.aclose()

    times = asyncio.run(scenario())
    sent = times["a-99:sent"]
    later_firsts = sorted(times[f"a-{i}"] for i in range(12))[4:]
    drain = max(times[f"a-{i}:done"] for i in range(12))
    assert sent < later_firsts[0], "the backlog drained before the request came: the scenario measured nothing"
    assert times["a-99"] < later_firsts[0], (times["a-99"], later_firsts)
    assert times["a-99"] - sent < (drain - sent) / 5, (times["a-99"], drain)


def test_tiers_come_before_shares_in_admission_slots_and_preemption():
    """FairShare with tiers: the best tier waiting is admitted first whatever the virtual times; a waiting
    sequence of a better tier takes a full batch's slot from the worst tier running; pages are taken back from
    the worst tier first; within a tier the shares hold as before."""

    class Seq:
        def __init__(self, tenant: str, tier: str, admitted: int = 0) -> None:
            self.tenant, self.weight, self.admitted, self.arrived = tenant, 1.0, admitted, 0
            self.rank, self.position = TIER_RANK[tier], 0

    share = FairShare()
    running = [Seq("a", "flex", 0), Seq("b", "default", 1)]
    share.charge(running[1], 1000)  # b far ahead of a in virtual time
    waiting_default = Seq("c", "default")
    share.push(waiting_default, running)
    waiting_priority = Seq("b", "priority")
    share.push(waiting_priority, running)
    assert share.head() is waiting_priority  # the best tier first, though b is furthest ahead
    assert share.claim(running, 2) == (waiting_priority, running[0])  # the flex sequence gives its slot
    assert share.victim(running) is running[0]  # pages: flex first, though b is further ahead
    share.pop(waiting_priority)
    assert share.claim(running, 2) == (waiting_default, running[0])  # a default one still outranks flex
    only_default = [running[1], Seq("b", "default", 2)]
    claim = share.claim(only_default, 2)  # same tier: c below its share (0 of 1), b above (2 of 1)
    assert claim == (waiting_default, only_default[1])
