"""One generation, API-neutral: prompt ids → backend → output assembler → item events and an outcome."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from time import perf_counter
from typing import Literal
from weakref import WeakKeyDictionary

import structlog

from backends.base import Backend, BackendError, Constraint, GenerateRequest, Sampling, SchedulingTier
from harmony import STOP_TOKENS_FOR_ASSISTANT_ACTIONS, HarmonyEncoding, StopReason

from ..observability.metrics import TurnObserver
from ..observability.tracing import end_generation_span, generation_span
from ..process.lifecycle import CUT_MESSAGE, SHUTTING_DOWN, Lifecycle
from .assembler import CallRouting, ItemEvent, OutputAssembler
from .constraints import NOT_ENFORCED, violation

log = structlog.get_logger("gateway.generation.turn")

# how long a generation may run on the event loop before it lets other tasks run: a backend with its tokens
# ready (an instant one, a burst after a stall) would otherwise run a whole answer in one step while other
# requests wait; a backend that waits on the network gives way by itself (a wait longer than
# BACKEND_WAITED_S counts as such, and no pause is added)
FAIR_SHARE_S = 0.0005
BACKEND_WAITED_S = 0.0005
# generations resumed per loop iteration after their share: the other callbacks of an iteration (a new
# request's next step, a socket's data) wait for at most this many slices, not for every running generation's
SLICES_PER_ITERATION = 2


class _Turns:
    """The generations of one event loop waiting to run again after their share, resumed in arrival order,
    SLICES_PER_ITERATION in each loop iteration."""

    def __init__(self) -> None:  # holds no reference to its loop: the loop is the key it is kept under
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._releasing = False

    def wait(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        future = loop.create_future()
        self._waiting.append(future)
        if not self._releasing:
            self._releasing = True
            loop.call_soon(self._release, loop)
        return future

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._waiting
        released = 0
        while waiting and released < SLICES_PER_ITERATION:
            future = waiting.popleft()
            if not future.done():  # done: its generation was cancelled meanwhile
                future.set_result(None)
                released += 1
        if waiting:
            loop.call_soon(self._release, loop)  # the next iteration's
        else:
            self._releasing = False


_TURNS: WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = WeakKeyDictionary()


def _next_turn() -> asyncio.Future[None]:
    """Resolves when this generation may run again."""
    loop = asyncio.get_running_loop()
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = _Turns()
    return turns.wait(loop)


Status = Literal["completed", "incomplete", "failed", "cancelled"]


@dataclass(slots=True)
class Outcome:
    status: Status
    incomplete_reason: str | None = None
    error_code: str | None = None
    error_message: str | None = None


class Turn:
    """Iterate `events()` once; then read `outcome`, `assembler.items` and token counts."""

    def __init__(
        self,
        backend: Backend,
        encoding: HarmonyEncoding,
        prompt: list[int],
        max_new_tokens: int,
        sampling: Sampling,
        constraint: Constraint,
        request_id: str,
        observer: TurnObserver | None = None,
        lifecycle: Lifecycle | None = None,
        routing: CallRouting | None = None,
        cache_key: str | None = None,
        assembler: OutputAssembler | None = None,
        tenant: str = "",
        top_logprobs: int | None = None,
        deltas: bool = True,
        weight: float = 1.0,
        tier: SchedulingTier = "default",
    ) -> None:
        """`weight`: the tenant's in an engine's fair share; `tier`: the service tier applied."""
        self.backend = backend
        self._observer = observer
        self._lifecycle = lifecycle
        self._cut = False  # the gateway is shutting down: stop reading the backend, fail the answer
        self._task: asyncio.Task[object] | None = None  # the task generating, found once when it starts
        self._awaiting_backend = False  # that task is waiting for the backend's next chunk
        self._cancelled_by_cut = False
        # a tool loop's turns share one; `deltas`: text as Delta events too (for a listener)
        self.assembler = assembler or OutputAssembler(encoding, routing, top_logprobs, deltas)
        self._base_output = self.assembler.output_tokens  # what earlier turns of the loop generated
        self._base_reasoning = self.assembler.reasoning_tokens
        self.prompt_tokens = len(prompt)
        self.cached_tokens = 0
        self.outcome: Outcome | None = None
        self._request = GenerateRequest(
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            stop_ids=tuple(STOP_TOKENS_FOR_ASSISTANT_ACTIONS),
            request_id=request_id,
            sampling=sampling,
            constraint=constraint if backend.capabilities.constraints else Constraint(),
            cache_key=cache_key,
            tenant=tenant,
            top_logprobs=top_logprobs,
            weight=weight,
            tier=tier,
        )
        self._constraint = constraint
        self._stops = frozenset(self._request.stop_ids)
        self._output_limit = self._base_output + max_new_tokens  # the assembler's count where this turn must end

    def cut(self) -> None:
        """End the generation now (the drain budget is spent): the answer fails with a shutting-down error."""
        self._cut = True
        if self._awaiting_backend and self._task is not None:
            self._cancelled_by_cut = True
            self._task.cancel()

    def _report(self) -> None:
        if self._observer is None:
            return
        outcome, assembler = self.outcome, self.assembler
        failed = outcome is not None and outcome.status == "failed" and outcome.error_code != NOT_ENFORCED
        self._observer.finished(
            failed,
            self.prompt_tokens,
            self.cached_tokens,
            self.output_tokens,
            assembler.reasoning_tokens - self._base_reasoning,
        )

    async def prewarm(self) -> int:
        """Prefill this turn's prompt with one token's generation, its output dropped, so that a backend with a
        prefix cache holds it for a continuation (best effort: a failure leaves the cache cold); the tokens
        generated. The turn itself is not run."""
        request = dataclasses.replace(
            self._request,
            max_new_tokens=1,
            sampling=Sampling(temperature=0.0),
            constraint=Constraint(),
            request_id=self._request.request_id + "/prewarm",
            top_logprobs=None,
        )
        generated = 0
        try:
            async with aclosing(self.backend.generate(request)) as chunks:
                async for chunk in chunks:
                    generated += len(chunk.tokens)
        except BackendError as exc:
            log.warning("prewarm_failed", request_id=request.request_id, error=str(exc))
        return generated

    @property
    def output_tokens(self) -> int:
        """Generated by this turn."""
        return self.assembler.output_tokens - self._base_output

    async def events(self) -> AsyncIterator[list[ItemEvent]]:
        """Batches of item events as tokens arrive; closing the iterator cancels the generation. (One
        generator, the backend awaited inline: this runs once per chunk of every answer.)"""
        if self._lifecycle is not None:
            self._lifecycle.generation_started(self)
        assembler = self.assembler
        observer = self._observer
        ended = False  # a stop token or the token limit was reached; only a usage report may follow
        running_since = perf_counter()  # when this generation last let other tasks run
        self._task = asyncio.current_task()
        span = generation_span(observer.model if observer is not None else "", self._request)
        first_token = True
        try:
            try:
                if not self._cut:  # a cut before the start (a drain past its budget) asks nothing of the backend
                    async with aclosing(self.backend.generate(self._request)) as chunks:
                        # `_awaiting_backend` while the loop waits for a chunk, and only then (cut() cancels that wait)
                        self._awaiting_backend = True
                        asked = perf_counter()
                        try:
                            async for chunk in chunks:
                                self._awaiting_backend = False
                                got = perf_counter()
                                if got - asked > BACKEND_WAITED_S:
                                    running_since = got  # the backend waited: other tasks ran meanwhile
                                elif got - running_since > FAIR_SHARE_S:
                                    await _next_turn()
                                    running_since = perf_counter()
                                if chunk.cached_tokens is not None:
                                    self.cached_tokens = min(chunk.cached_tokens, self.prompt_tokens)
                                if not ended:
                                    tokens, ended = self._accept(chunk.tokens)
                                    if tokens and first_token:
                                        first_token = False
                                        span.add_event("gen_ai.first_token")
                                    content_before = assembler.content_events
                                    events = assembler.feed(tokens, chunk.logprobs)
                                    if tokens and observer is not None:
                                        content = assembler.content_events != content_before
                                        observer.tokens(len(tokens), content)
                                    if events:
                                        yield events
                                elif chunk.tokens:
                                    break  # the backend runs past the end: closing it cancels the generation
                                if self._cut:
                                    break
                                self._awaiting_backend = True
                                asked = perf_counter()
                        finally:
                            self._awaiting_backend = False
            except asyncio.CancelledError:
                if not self._absorb_cut():
                    raise
            except Exception as exc:  # a backend failure fails this response, never the process
                log.warning("backend_failed", request_id=self._request.request_id, error=type(exc).__name__)
                message = str(exc) if isinstance(exc, BackendError) else "The model backend failed."
                self.outcome = Outcome("failed", error_code="server_error", error_message=message)
            if self._cut and not ended:
                self.outcome = Outcome("failed", error_code=SHUTTING_DOWN, error_message=CUT_MESSAGE)
            tail = assembler.finish()
            if tail:
                yield tail
            if self.outcome is None:
                self.outcome = self._judge()
        finally:
            if self._lifecycle is not None:
                self._lifecycle.generation_ended(self)
            self._report()
            end_generation_span(span, self)

    def _absorb_cut(self) -> bool:
        """Whether a cancellation is the cut's alone (then it is taken back); any other cancellation stands."""
        if not self._cancelled_by_cut:
            return False
        self._cancelled_by_cut = False
        task = asyncio.current_task()
        return task is not None and task.uncancel() == 0

    def _accept(self, tokens: list[int]) -> tuple[list[int], bool]:
        """The tokens up to the first stop id and within the limit, and whether the output ends there."""
        room = self._output_limit - self.assembler.output_tokens
        if len(tokens) == 1:  # most chunks: one token
            if room <= 0:
                return [], True
            return tokens, tokens[0] in self._stops or room == 1
        accepted = tokens[:room] if room > 0 else []
        for index, token in enumerate(accepted):
            if token in self._stops:
                return accepted[: index + 1], True
        return accepted, len(accepted) >= room

    def _judge(self) -> Outcome:
        assembler = self.assembler
        finished = assembler.stop in (StopReason.RETURN, StopReason.CALL)
        if not finished and self.output_tokens >= self._request.max_new_tokens:
            return Outcome("incomplete", incomplete_reason="max_output_tokens")
        if not self.backend.capabilities.constraints and not self._constraint.is_free:
            problem = violation(self._constraint, assembler.items)
            if problem:
                return Outcome("failed", error_code=NOT_ENFORCED, error_message=problem)
        return Outcome("completed")
