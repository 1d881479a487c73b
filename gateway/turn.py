"""One generation, API-neutral: prompt ids → backend → output assembler → item events and an outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

import structlog

from backends.base import Backend, BackendError, Chunk, Constraint, GenerateRequest, Sampling
from harmony import STOP_TOKENS_FOR_ASSISTANT_ACTIONS, HarmonyEncoding, StopReason

from .assembler import CallRouting, Delta, ItemEvent, Opened, OutputAssembler
from .constraints import NOT_ENFORCED, violation
from .lifecycle import CUT_MESSAGE, SHUTTING_DOWN, Lifecycle
from .metrics import TurnObserver

log = structlog.get_logger("gateway.turn")

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
    ) -> None:
        self.backend = backend
        self._observer = observer
        self._lifecycle = lifecycle
        self._cut = False  # the gateway is shutting down: stop reading the backend, fail the answer
        self._task: asyncio.Task[object] | None = None  # the task generating, found once when it starts
        self._awaiting_backend = False  # that task is waiting for the backend's next chunk
        self._cancelled_by_cut = False
        self.assembler = OutputAssembler(encoding, routing)
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
        )
        self._constraint = constraint

    async def events(self) -> AsyncIterator[list[ItemEvent]]:
        """Batches of item events as tokens arrive; closing the iterator cancels the generation."""
        if self._lifecycle is not None:
            self._lifecycle.generation_started(self)
        try:
            async for events in self._generate():
                yield events
        finally:
            if self._lifecycle is not None:
                self._lifecycle.generation_ended(self)
            self._report()

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
            failed, self.prompt_tokens, self.cached_tokens, assembler.output_tokens, assembler.reasoning_tokens
        )

    async def _generate(self) -> AsyncIterator[list[ItemEvent]]:
        assembler = self.assembler
        ended = False  # a stop token or the token limit was reached; only a usage report may follow
        self._task = asyncio.current_task()
        try:
            async with aclosing(self.backend.generate(self._request)) as chunks:
                while (chunk := await self._next(chunks)) is not None:
                    if chunk.cached_tokens is not None:
                        self.cached_tokens = min(chunk.cached_tokens, self.prompt_tokens)
                    if ended:
                        if chunk.tokens:
                            break  # the backend runs past the end: closing it cancels the generation
                        continue
                    tokens, ended = self._accept(chunk.tokens)
                    events = assembler.feed(tokens)
                    if tokens and self._observer is not None:
                        self._observer.tokens(len(tokens), any(map(_is_content, events)))
                    if events:
                        yield events
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

    async def _next(self, chunks: AsyncIterator[Chunk]) -> Chunk | None:
        """The backend's next chunk; None at its end or once the generation is cut."""
        if self._cut:
            return None
        self._awaiting_backend = True
        try:
            return await anext(chunks, None)
        finally:
            self._awaiting_backend = False

    def _absorb_cut(self) -> bool:
        """Whether a cancellation is the cut's alone (then it is taken back); any other cancellation stands."""
        if not self._cancelled_by_cut:
            return False
        self._cancelled_by_cut = False
        task = asyncio.current_task()
        return task is not None and task.uncancel() == 0

    def _accept(self, tokens: list[int]) -> tuple[list[int], bool]:
        """The tokens up to the first stop id and within the limit, and whether the output ends there."""
        request = self._request
        room = request.max_new_tokens - self.assembler.output_tokens
        for index, token in enumerate(tokens[:room]):
            if token in request.stop_ids:
                return tokens[: index + 1], True
        accepted = tokens[:room]
        return accepted, self.assembler.output_tokens + len(accepted) >= request.max_new_tokens

    def _judge(self) -> Outcome:
        assembler = self.assembler
        finished = assembler.stop in (StopReason.RETURN, StopReason.CALL)
        if not finished and assembler.output_tokens >= self._request.max_new_tokens:
            return Outcome("incomplete", incomplete_reason="max_output_tokens")
        if not self.backend.capabilities.constraints and not self._constraint.is_free:
            problem = violation(self._constraint, assembler.items)
            if problem:
                return Outcome("failed", error_code=NOT_ENFORCED, error_message=problem)
        return Outcome("completed")


def _is_content(event: ItemEvent) -> bool:
    """Answer text or a tool call, as opposed to reasoning: what the time to first content token measures."""
    if isinstance(event, Delta):
        return event.item.kind != "reasoning"
    return isinstance(event, Opened) and event.item.is_call
