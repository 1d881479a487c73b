"""The Turn holds every backend to the stop tokens and the token limit, even one that runs past them."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from backends.base import Capabilities, Chunk, Constraint, Sampling
from gateway.generation import turn as turn_module
from gateway.generation.turn import Turn
from gateway.process.lifecycle import Lifecycle

ANSWER = "<|channel|>final<|message|>done<|return|>"
RUN_ON = "<|start|>assistant<|channel|>final<|message|>" + " more" * 40


class RunawayBackend:
    """Ignores stop ids and limits; records how many chunks were taken and whether it was closed."""

    def __init__(self, encoding, text: str, per_chunk: int) -> None:
        self.capabilities = Capabilities(context_length=4096)
        self._tokens = encoding.encode_marked(text)
        self._per_chunk = per_chunk
        self.taken = 0
        self.closed = False

    async def generate(self, request):
        try:
            for start in range(0, len(self._tokens), self._per_chunk):
                self.taken += 1
                yield Chunk(self._tokens[start : start + self._per_chunk])
            yield Chunk([], cached_tokens=3)
        finally:
            self.closed = True

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def _run(turn: Turn) -> None:
    asyncio.run(_consume(turn))


@pytest.mark.parametrize("per_chunk", [1, 3, 100])
def test_output_ends_at_the_first_stop_token(encoding, per_chunk):
    backend = RunawayBackend(encoding, ANSWER + RUN_ON, per_chunk)
    prompt = encoding.encode_marked("<|start|>user<|message|>hi<|end|><|start|>assistant")
    turn = Turn(backend, encoding, prompt, 500, Sampling(), Constraint(), "req")
    _run(turn)
    assert [item.text for item in turn.assembler.items] == ["done"]
    assert turn.assembler.output_tokens == len(encoding.encode_marked(ANSWER))
    assert turn.outcome.status == "completed"
    assert backend.closed
    assert backend.taken <= len(encoding.encode_marked(ANSWER)) // per_chunk + 2  # one chunk past the stop at most


def test_output_is_cut_at_the_token_limit(encoding):
    backend = RunawayBackend(encoding, RUN_ON, 4)
    turn = Turn(backend, encoding, [1, 2, 3], 10, Sampling(), Constraint(), "req")
    _run(turn)
    assert turn.assembler.output_tokens == 10
    assert (turn.outcome.status, turn.outcome.incomplete_reason) == ("incomplete", "max_output_tokens")
    assert backend.closed and backend.taken <= 4


def test_a_usage_report_after_the_stop_is_kept(encoding):
    backend = RunawayBackend(encoding, ANSWER, 2)
    turn = Turn(backend, encoding, [1, 2, 3, 4], 500, Sampling(), Constraint(), "req")
    _run(turn)
    assert turn.cached_tokens == 3


class StallingBackend(RunawayBackend):
    """Sends a few tokens of an answer, then waits for a token that never comes."""

    def __init__(self, encoding, text: str, per_chunk: int) -> None:
        super().__init__(encoding, text, per_chunk)
        self.stalled = asyncio.Event()

    async def generate(self, request):
        try:
            yield Chunk(self._tokens[:3])
            self.stalled.set()
            await asyncio.sleep(3600)
        finally:
            self.closed = True


def test_a_drain_cut_fails_the_generation_and_closes_the_backend(encoding):
    backend = StallingBackend(encoding, ANSWER, 1)
    lifecycle = Lifecycle()

    async def scenario() -> Turn:
        turn = Turn(backend, encoding, [1, 2], 500, Sampling(), Constraint(), "req", lifecycle=lifecycle)
        consumer = asyncio.ensure_future(_consume(turn))
        await backend.stalled.wait()
        lifecycle.enter()  # a request in flight, so that the drain waits, then cuts
        drain = asyncio.ensure_future(lifecycle.drain(budget_s=0.05))
        await consumer  # ends by itself once cut: the cut is not a cancellation of the consumer
        lifecycle.leave()
        await drain
        return turn

    turn = asyncio.run(scenario())
    assert (turn.outcome.status, turn.outcome.error_code) == ("failed", "server_shutting_down")
    assert backend.closed and lifecycle.cutting


def test_a_cancellation_during_a_cut_still_cancels(encoding):
    backend = StallingBackend(encoding, ANSWER, 1)

    async def scenario() -> None:
        turn = Turn(backend, encoding, [1, 2], 500, Sampling(), Constraint(), "req", lifecycle=Lifecycle())
        consumer = asyncio.ensure_future(_consume(turn))
        await backend.stalled.wait()
        consumer.cancel()  # the client left at the same moment
        turn.cut()
        with pytest.raises(asyncio.CancelledError):
            await consumer

    asyncio.run(scenario())
    assert backend.closed


async def _consume(turn: Turn) -> None:
    async for _ in turn.events():
        pass


@pytest.mark.parametrize("fair_share_s", [0.0, 3600.0])
def test_a_backend_with_its_tokens_ready_does_not_hold_the_event_loop(encoding, monkeypatch, fair_share_s):
    """A backend that never waits (an instant one, a burst) gives way after FAIR_SHARE_S of work: another task
    gets to run while the answer is generated; with an hour's share, only after it."""
    monkeypatch.setattr("gateway.generation.turn.FAIR_SHARE_S", fair_share_s)
    backend = RunawayBackend(encoding, RUN_ON * 50, 1)
    turn = Turn(backend, encoding, [1, 2, 3], 200, Sampling(), Constraint(), "req")
    seen_during: list[int] = []

    async def scenario() -> None:
        async def other() -> None:
            seen_during.append(turn.assembler.output_tokens)

        task = asyncio.ensure_future(other())
        async for _ in turn.events():
            pass
        await task

    asyncio.run(scenario())
    if fair_share_s:
        assert seen_during == [200]  # it ran only once the whole answer was made
    else:
        assert seen_during[0] < 200  # it ran in the middle of the answer


def test_ready_generations_take_turns_so_a_new_callback_waits_for_few_of_them(encoding, monkeypatch):
    """Twenty generations with their tokens ready, each giving way after every chunk: a callback that arrives
    meanwhile (a new request's next step) runs after at most SLICES_PER_ITERATION of them have moved on, not
    after all twenty; every generation still makes its whole answer."""
    monkeypatch.setattr("gateway.generation.turn.FAIR_SHARE_S", 0.0)
    turns = [
        Turn(RunawayBackend(encoding, RUN_ON * 5, 1), encoding, [1, 2, 3], 100, Sampling(), Constraint(), f"r{i}")
        for i in range(20)
    ]
    moved_on: list[int] = []

    def produced() -> int:
        return sum(turn.assembler.output_tokens for turn in turns)

    async def scenario() -> None:
        generations = [asyncio.ensure_future(_consume(turn)) for turn in turns]
        for _ in range(5):
            await asyncio.sleep(0)
        before = produced()
        assert 0 < before < 20 * 100
        asyncio.get_running_loop().call_soon(lambda: moved_on.append(produced() - before))
        await asyncio.gather(*generations)

    asyncio.run(scenario())
    assert moved_on and moved_on[0] <= turn_module.SLICES_PER_ITERATION  # one token per slice here
    assert all(turn.assembler.output_tokens == 100 for turn in turns)


def test_the_turn_queue_does_not_keep_a_finished_loop(encoding, monkeypatch):
    monkeypatch.setattr("gateway.generation.turn.FAIR_SHARE_S", 0.0)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def scenario() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        turn = Turn(RunawayBackend(encoding, RUN_ON, 1), encoding, [1, 2, 3], 20, Sampling(), Constraint(), "r")
        await _consume(turn)  # waits in the loop's turn queue after every chunk

    for _ in range(3):
        asyncio.run(scenario())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
