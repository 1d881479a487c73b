"""A prompt chunk runs in pieces, one a step beside the decode rows: a request arriving from another tenant waits one
piece for its first token, and a running answer one piece for its next, not the whole chunk; the pieces write the same
cache as the whole chunk would."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling
from backends.engine import batcher, chunk_budget
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.batcher import FIRST_TOKENS
from backends.engine.chunk_budget import FLOOR_TOKENS, ChunkPieces, GiveWay
from harmony import load_harmony_encoding


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("pieces") / "model", tiny_config(), "original")


def _calibrated(monkeypatch, fixed: float, per_token: float, growth: float, piece_s: float) -> ChunkPieces:
    clock = [0.0]
    monkeypatch.setattr(chunk_budget.time, "perf_counter", lambda: clock[0])

    def run(tokens: int, start: int) -> None:
        clock[0] += fixed + tokens * (per_token + growth * start)

    pieces = ChunkPieces(piece_s)
    pieces.calibrate(run, far=2048)
    return pieces


def test_calibration_fits_a_run_s_cost_and_pieces_keep_to_the_time(monkeypatch):
    """Runs costing 0.5 ms + 30 µs a token (+ 0.01 µs a token per position) are fitted back; a 512-token chunk's
    first piece from position 0 takes about 10 ms, and has fewer tokens far into the context."""
    pieces = _calibrated(monkeypatch, 0.0005, 30e-6, 1e-11 * 1000, 0.010)
    fixed, per_token, growth = pieces.fit
    assert fixed == pytest.approx(0.0005, rel=1e-6) and per_token == pytest.approx(30e-6, rel=1e-6)
    assert growth == pytest.approx(1e-8, rel=1e-6)
    chunk = list(range(512))
    near = pieces.first(chunk, 0)
    assert near == chunk[: int((0.010 - 0.0005) / 30e-6)]  # 316 tokens: 9.5 ms of tokens beside 0.5 fixed
    far = pieces.first(chunk, 3000)
    assert far == chunk[: len(far)] and len(far) < len(near)


def test_pieces_never_cut_so_short_that_a_run_s_fixed_cost_weighs(monkeypatch):
    """A run's fixed cost of 1 s (a CPU reading every expert at the real width) against 10 ms a token: pieces stay at
    least 1 s / (10% × 10 ms) = 1,000 tokens, so a 512-token chunk runs whole; pieces off (0) always run it whole."""
    heavy = _calibrated(monkeypatch, 1.0, 0.010, 0.0, 0.010)
    assert heavy.first(list(range(512)), 0) == list(range(512))
    off = _calibrated(monkeypatch, 0.0005, 30e-6, 0.0, 0.0)
    assert off.fit is None and off.first(list(range(512)), 0) == list(range(512))
    tiny = _calibrated(monkeypatch, 0.0, 0.010, 0.0, 0.001)  # 1 ms at 10 ms a token: the floor
    assert len(tiny.first(list(range(64)), 0)) == FLOOR_TOKENS


def _request(tenant: str, prompt_tokens: int, output: int) -> GenerateRequest:
    prompt = [200006, 17360, 200008, *((i * 7919) % 50_000 + 100 for i in range(prompt_tokens))]
    return GenerateRequest(prompt, output, (), f"{tenant}-{prompt_tokens}", sampling=Sampling(temperature=0),
                           tenant=tenant)  # fmt: skip


@dataclass
class Outcome:
    order: list[str] = field(default_factory=list)  # the tenants whose tokens came, runs of one tenant as one entry
    a_tokens: list[int] = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)  # each tenant's token arrival times

    def longest_gap(self, tenant: str) -> float:
        times = self.times[tenant]
        return max(later - earlier for earlier, later in itertools.pairwise(times))


async def _scenario(
    checkpoint: Path, tmp_path: Path, piece_ms: float, first: GenerateRequest, second: GenerateRequest
) -> Outcome:
    """Run `first`, then `second` once `first` runs."""
    options = EngineOptions(
        checkpoint=str(checkpoint), max_batch=4, max_positions=8192, prefill_chunk=8192,
        prefill_piece_ms=piece_ms, cache_dir=str(tmp_path),
    )  # fmt: skip
    engine = await loaded(EngineBackend(options, load_harmony_encoding()))
    outcome = Outcome()
    try:

        async def run(request: GenerateRequest) -> None:
            async for chunk in engine.generate(request):
                if not outcome.order or outcome.order[-1] != request.tenant:
                    outcome.order.append(request.tenant)
                if request.tenant == "a":
                    outcome.a_tokens.extend(chunk.tokens)
                outcome.times.setdefault(request.tenant, []).extend(time.monotonic() for _ in chunk.tokens)

        started = time.monotonic()
        running = asyncio.ensure_future(run(first))
        while engine.engine_stats().running == 0 and time.monotonic() - started < 30:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # the first one's chunk (or decode) is running
        await asyncio.gather(running, run(second))
    finally:
        await engine.aclose()
    return outcome


def test_another_tenant_s_first_token_waits_one_piece_not_the_whole_chunk(checkpoint, tmp_path):
    """Tenant A's 6,000-token prompt runs as one chunk; tenant B's short request sent once A's chunk runs. Chunks
    whole: B's first token comes after A's (B waited for all of A's chunk). In pieces of 5 ms: B's first token
    comes first, and A's answer is the same token for token (the pieces wrote the same cache)."""

    def scenario(piece_ms: float) -> Outcome:
        return asyncio.run(_scenario(checkpoint, tmp_path, piece_ms, _request("a", 6000, 4), _request("b", 20, 2)))

    whole = scenario(0.0)
    assert whole.order[0] == "a", f"B came before A's whole chunk ended: the scenario measured nothing ({whole.order})"
    pieces = scenario(5.0)
    assert pieces.order[0] == "b", pieces.order
    assert pieces.a_tokens == whole.a_tokens


def test_a_running_answer_s_tokens_wait_one_piece_not_the_whole_chunk(checkpoint, tmp_path):
    """Tenant B decodes 64 tokens; tenant A's 6,000-token prompt arrives meanwhile. Chunks whole: one of the gaps
    between B's tokens holds A's whole chunk. In pieces of 5 ms each step runs B's row beside one piece: B's longest
    gap is a small part of that, and A's answer is the same."""

    def scenario(piece_ms: float) -> Outcome:
        return asyncio.run(_scenario(checkpoint, tmp_path, piece_ms, _request("b", 20, 64), _request("a", 6000, 4)))

    whole = scenario(0.0)
    assert "a" in whole.order[:-1], f"B ended before A's chunk ran: nothing measured ({whole.order})"
    pieces = scenario(5.0)
    assert pieces.longest_gap("b") < whole.longest_gap("b") / 4, (pieces.longest_gap("b"), whole.longest_gap("b"))
    assert pieces.a_tokens == whole.a_tokens


async def _prefill_during_b_s_start(checkpoint: Path, tmp_path: Path, a_tier: str) -> list[int]:
    """A's 6,000-token prompt at `a_tier` runs in pieces of 5 ms; B's short default request arrives meanwhile: the
    engine's prefill tokens (B's own prompt and A's pieces) as each of B's first two tokens arrives."""
    options = EngineOptions(
        checkpoint=str(checkpoint), max_batch=4, max_positions=8192, prefill_chunk=8192, prefill_piece_ms=5.0,
        cache_dir=str(tmp_path),
    )  # fmt: skip
    engine = await loaded(EngineBackend(options, load_harmony_encoding()))
    a_request = replace(_request("a", 6000, 2), tier=a_tier)
    seen: list[int] = []
    try:
        a = asyncio.ensure_future(_drain(engine, a_request))
        started = time.monotonic()
        while engine.engine_stats().prefill_tokens == 0 and time.monotonic() - started < 30:
            await asyncio.sleep(0.001)  # A's pieces are running
        async for chunk in engine.generate(_request("b", 20, 8)):
            seen += [engine.engine_stats().prefill_tokens] * len(chunk.tokens)
            if len(seen) >= 2:
                break
        await a
    finally:
        await engine.aclose()
    return seen


async def _drain(engine: EngineBackend, request: GenerateRequest) -> None:
    async for _ in engine.generate(request):
        pass


def test_a_worse_tier_s_prompt_waits_while_a_better_tier_s_answer_begins(checkpoint, tmp_path, monkeypatch):
    """Between B's first and second tokens (the first steps of B's Harmony header) A's prompt goes on by a piece
    when A is of B's tier, and by nothing when A is `flex`: B's answer begins without A's pieces in its steps. (The
    banks of giving way within a tier are empty: the tier alone decides.)"""
    monkeypatch.setattr(batcher, "GiveWay", lambda: GiveWay(share=0.0, bank_s=0.0))
    same = asyncio.run(_prefill_during_b_s_start(checkpoint, tmp_path, "default"))
    assert same[1] > same[0], f"A's prompt ended before B began: nothing measured ({same})"
    flex = asyncio.run(_prefill_during_b_s_start(checkpoint, tmp_path, "flex"))
    assert flex[1] == flex[0], flex


async def _prefill_as_b_begins(checkpoint: Path, tmp_path: Path, b_tenant: str = "b") -> list[int]:
    """Tenant A decodes a long answer while its 6,000-token prompt runs in pieces of 5 ms; a short request of
    `b_tenant` (B: one sequence against A's two, the same tier; or A's own) arrives meanwhile: the engine's prefill
    tokens as each of its first FIRST_TOKENS tokens arrives."""
    options = EngineOptions(
        checkpoint=str(checkpoint), max_batch=4, max_positions=8192, prefill_chunk=8192, prefill_piece_ms=5.0,
        cache_dir=str(tmp_path),
    )  # fmt: skip
    engine = await loaded(EngineBackend(options, load_harmony_encoding()))
    seen: list[int] = []
    try:
        first = _request("a", 30, 600)
        answer = engine.generate(first)
        await anext(answer)  # A is decoding
        prompt = asyncio.ensure_future(_drain(engine, _request("a", 6000, 2)))
        started = time.monotonic()
        while engine.engine_stats().prefill_tokens <= len(first.prompt) and time.monotonic() - started < 30:
            await asyncio.sleep(0.001)  # A's long prompt's pieces are running
        async for chunk in engine.generate(_request(b_tenant, 20, 8)):
            seen += [engine.engine_stats().prefill_tokens] * len(chunk.tokens)
            if len(seen) >= FIRST_TOKENS:
                break
        await answer.aclose()
        await prompt
    finally:
        await engine.aclose()
    return seen


def test_a_prompt_gives_way_while_a_lighter_tenant_s_answer_begins(checkpoint, tmp_path, monkeypatch):
    """Between B's first token and its FIRST_TOKENS-th (its Harmony header and first text) A's prompt goes on by no
    piece: B runs fewer sequences than A. With the bank of that waiting empty, A's pieces go on in those steps. (The
    first run's bank is deep, so a slow machine's steps cannot drain it: its arithmetic is tested below.)"""
    monkeypatch.setattr(batcher, "GiveWay", lambda: GiveWay(bank_s=60.0))
    waited = asyncio.run(_prefill_as_b_begins(checkpoint, tmp_path))
    assert len(set(waited)) == 1, waited
    monkeypatch.setattr(batcher, "GiveWay", lambda: GiveWay(share=0.0, bank_s=0.0))
    ran = asyncio.run(_prefill_as_b_begins(checkpoint, tmp_path))
    assert ran[-1] > ran[0], f"A's prompt ended before B began: nothing measured ({ran})"


def test_a_prompt_gives_way_while_its_own_tenant_s_short_answer_begins(checkpoint, tmp_path, monkeypatch):
    """A's own short request (a conversation's next turn) arriving while A's 6,000-token prompt fills: its first
    FIRST_TOKENS tokens come with A's prompt advanced by no piece, from the bank of answers of the prompt's own
    tenant (the lighter tenants' bank empty); with that bank empty too, A's pieces go on in those steps."""
    banks = iter([GiveWay(share=0.0, bank_s=0.0), GiveWay(bank_s=60.0)])  # the lighter tenants', then the alike's
    monkeypatch.setattr(batcher, "GiveWay", lambda: next(banks))
    waited = asyncio.run(_prefill_as_b_begins(checkpoint, tmp_path, b_tenant="a"))
    assert len(set(waited)) == 1, waited
    monkeypatch.setattr(batcher, "GiveWay", lambda: GiveWay(share=0.0, bank_s=0.0))
    ran = asyncio.run(_prefill_as_b_begins(checkpoint, tmp_path, b_tenant="a"))
    assert ran[-1] > ran[0], f"A's prompt ended before its short answer began: nothing measured ({ran})"


def test_the_give_way_bank_fills_at_its_share_of_the_clock_up_to_its_cap():
    """Waiting spends the bank; it refills at a tenth of the time passed, never past its cap, and an empty bank says
    no until it has refilled."""
    clock = [0.0]
    bank = GiveWay(share=0.1, bank_s=0.05, steps=1, clock=lambda: clock[0])  # steps shorter than the cap
    assert bank.open()
    bank.spend(0.05)
    assert not bank.open()
    clock[0] += 0.2  # refills 0.02
    assert bank.open()
    bank.spend(0.03)
    assert not bank.open()
    clock[0] += 10.0  # a long quiet: the cap, not 1 s
    assert bank.open()
    bank.spend(0.049)
    assert bank.open()
    bank.spend(0.002)
    assert not bank.open()


def test_the_give_way_bank_holds_an_answer_s_beginning_of_steps_as_long_as_the_last():
    """Steps longer than the least cap (a CPU at the real width): the bank, full before the first waiting step,
    holds `steps` of them as long as the last one took, so an answer's whole beginning waits for no piece; then it
    refills at its share up to that cap."""
    clock = [0.0]
    bank = GiveWay(share=0.1, bank_s=0.05, steps=4, clock=lambda: clock[0])
    for _ in range(4):  # a beginning's four steps of 80 ms each (the clock held: no refill meanwhile)
        assert bank.open()
        bank.spend(0.08)
    assert not bank.open()
    clock[0] += 100.0
    assert bank.open()
    assert bank.cap_s == pytest.approx(0.32)
    bank.spend(0.32)
    assert not bank.open()


class _StepRows:
    """The engine's runtime, with each step's rows written down: (which page table, how many tokens)."""

    def __init__(self, runtime) -> None:
        self.inner = runtime
        self.steps: list[list[tuple[int, int]]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def run(self, step):
        self.steps.append([(id(table), len(tokens)) for table, tokens in zip(step.tables, step.tokens, strict=True)])
        return self.inner.run(step)


async def _steps_as_b_begins(
    checkpoint: Path, tmp_path: Path, a_tier: str, b_tier: str
) -> tuple[list[list[int]], int, int]:
    """A decodes a long answer at `a_tier`; B's short request at `b_tier` arrives meanwhile and takes 8 tokens: every
    step's rows (page tables) from B's arrival, A's table and B's."""
    options = EngineOptions(checkpoint=str(checkpoint), max_batch=4, max_positions=1024, cache_dir=str(tmp_path))
    engine = await loaded(EngineBackend(options, load_harmony_encoding()))
    recorder = _StepRows(engine._batcher.runtime)
    engine._batcher.runtime = recorder
    a = engine.generate(replace(_request("a", 30, 600), tier=a_tier))
    try:
        for _ in range(3):
            await anext(a)  # A is decoding
        a_table = recorder.steps[-1][0][0]
        arrived = len(recorder.steps)
        async for _ in engine.generate(replace(_request("b", 20, 8), tier=b_tier)):
            pass
    finally:
        await a.aclose()
        await engine.aclose()
    steps = recorder.steps[arrived:]
    b_table = next(table for rows in steps for table, _ in rows if table != a_table)
    return steps, a_table, b_table


@pytest.mark.parametrize(("a_tier", "b_tier"), [("flex", "default"), ("default", "priority"), ("default", "default")])
def test_a_worse_tier_s_answer_pauses_while_a_better_tier_s_answer_begins(checkpoint, tmp_path, a_tier, b_tier):
    """B's first decode steps (its Harmony header, up to its first text) run without the row of A's answer of a worse
    tier (flex beside default, default beside priority), which goes on once B's has begun; beside an answer of A of
    B's own tier they run both rows."""
    steps, a_table, b_table = asyncio.run(_steps_as_b_begins(checkpoint, tmp_path, a_tier, b_tier))
    prompt = max(index for index, rows in enumerate(steps) if any(t == b_table and n > 1 for t, n in rows))
    # the rows run after B's prompt, in its step: A's beside B's of the same tier; none of a worse tier
    after_prompt = steps[prompt + 1]
    assert after_prompt == ([(a_table, 1)] if a_tier == b_tier else [(b_table, 1)]), steps
    b_decode_steps = [{table for table, _ in rows} for rows in steps if (b_table, 1) in rows]
    assert len(b_decode_steps) == 7, steps  # B's first token came from its prompt's step
    beginning = [a_table in tables for tables in b_decode_steps[: FIRST_TOKENS - 1]]
    assert beginning == [a_tier == b_tier] * (FIRST_TOKENS - 1), steps
    later = b_decode_steps[FIRST_TOKENS - 1 :]  # A goes on beside B's answer once it has begun
    assert all(a_table in tables for tables in later), steps
