"""One response's generation: the model's turns and, between them, the tools the gateway runs for it.

When a turn ends in a call to a server-side tool, the loop runs it, appends its answer as the tool's
Harmony message, renders the dialog again (the turn in progress keeps its chain of thought) and lets the
model go on, until it answers, calls a client's function, asks for an approval, or a cap is reached
(`max_tool_calls` and the operator's count, the tools' time budget, the output tokens, the context).
Without server-side tools it is exactly one turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from harmony import StopReason

from ..errors import ApiError
from ..hosted.results import McpListing, McpResult, NotRun, ToolResult
from ..hosted.toolset import Toolset
from .assembler import HOSTED_KINDS, Closed, Executing, ItemEvent, Opened, OutputAssembler, OutputItem, Settled
from .dialog import Entry
from .plan import CoreServices, Plan, plan_continuation
from .prompt import PromptSpec, tool_message
from .turn import Outcome, Turn

HOSTED_CALL_KINDS = (
    "web_search_call",
    "code_interpreter_call",
    "mcp_call",
    "mcp_approval_request",
)  # what the loop may run
MAX_REFUSED_CALLS = 2  # calls past the cap answered with a refusal before the loop stops


@dataclass(slots=True)
class PendingApproval:
    """A call waiting for the client's approval, and the client's answer (found in the dialog)."""

    request_id: str
    label: str
    name: str
    arguments: str
    channel: str
    approve: bool
    reason: str | None


class Generation:
    def __init__(
        self,
        services: CoreServices,
        first: Turn,
        plan: Plan,
        spec: PromptSpec,
        start: Callable[[Plan, OutputAssembler], Turn],
        toolset: Toolset | None = None,
        max_calls: int = 0,
        approvals: list[PendingApproval] | None = None,
        opening: list[ItemEvent] | None = None,
    ) -> None:
        """`opening`: events of items made before the first sampling (a compaction), sent first."""
        self.turn = first
        self._opening = opening or []
        self.assembler = first.assembler
        self._outcome: Outcome | None = None
        self.calls = 0
        self._services = services
        self._plan = plan
        self._spec = spec
        self._start = start
        self._toolset = toolset
        self._max_calls = max_calls
        self._approvals = approvals or []
        self._max_output = plan.max_new_tokens
        self._earlier_prompt = 0  # prompt tokens of the turns before the current one
        self._earlier_cached = 0
        self._refused = 0

    @property
    def outcome(self) -> Outcome | None:
        """The loop's own (a cap it hit), else its last turn's."""
        return self._outcome if self._outcome is not None else self.turn.outcome

    @property
    def prompt_tokens(self) -> int:
        """Every turn's prompt: each sampling reads the whole dialog again."""
        return self._earlier_prompt + self.turn.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self._earlier_cached + self.turn.cached_tokens

    def events(self) -> AsyncIterator[list[ItemEvent]]:
        """Batches of item events. Without server-side tools or opening items, the one turn's own (no layer
        between: this runs once per chunk of every answer)."""
        inner = self.turn.events() if self._toolset is None else self._run_loop(self._toolset)
        return self._after_opening(inner) if self._opening else inner

    async def _after_opening(self, inner: AsyncIterator[list[ItemEvent]]) -> AsyncIterator[list[ItemEvent]]:
        yield self._opening
        async with aclosing(inner) as batches:  # type: ignore[type-var]
            async for batch in batches:
                yield batch

    async def _run_loop(self, toolset: Toolset) -> AsyncIterator[list[ItemEvent]]:
        """The loop, then its calls left unrun (the response failed or stopped on one) settled as not run, so
        that every item of a finished response ends in a terminal status."""
        async with aclosing(self._loop(toolset)) as batches:
            async for batch in batches:
                yield batch
        unrun = [item for item in self.assembler.items if item.is_hosted and not item.settled]
        if unrun:
            yield [settle(item, NotRun("incomplete", toolset.container_id)) for item in unrun]

    async def _loop(self, toolset: Toolset) -> AsyncIterator[list[ItemEvent]]:
        for batch in self._listings(toolset):
            yield batch
        if self._approvals:
            async for batch in self._answer_approvals(toolset):
                yield batch
            if not await self._continue():
                return
        while True:
            async for batch in self.turn.events():
                if toolset.browser is not None:
                    _cite(batch, toolset)
                yield batch
            call = self._pending_call(self.turn.outcome)
            if call is None:
                return
            if call.kind == "mcp_approval_request":  # the client answers it in its next request
                yield [settle(call)]
                return
            async for batch in self._run(toolset, call):
                yield batch
            if self._refused > MAX_REFUSED_CALLS or not await self._continue():
                return

    def _listings(self, toolset: Toolset) -> list[list[ItemEvent]]:
        batches: list[list[ItemEvent]] = []
        for label, binding in toolset.mcp.items():
            if binding.listed:
                continue
            item = self.assembler.add("mcp_list_tools", namespace=label, done=True)
            tools = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                    "annotations": tool.annotations,
                }
                for tool in binding.tools
            ]
            batches.append([Opened(item), settle(item, McpListing(tools))])
        return batches

    async def _answer_approvals(self, toolset: Toolset) -> AsyncIterator[list[ItemEvent]]:
        for pending in self._approvals:
            recipient = f"{pending.label}.{pending.name}"
            if not pending.approve:
                declined = "The user declined this tool call." + (
                    f" Reason: {pending.reason}" if pending.reason else ""
                )
                self.assembler.add_entry(Entry(tool_message(recipient, declined, pending.channel)))
                continue
            item = self.assembler.add(
                "mcp_call", namespace=pending.label, name=pending.name, parts=[pending.arguments], done=True
            )
            item.call_id = pending.request_id
            yield [Opened(item), Executing(item)]
            self.calls += 1
            answer, result = await self._bounded(toolset, item)
            if isinstance(result, McpResult):
                result = dataclasses.replace(result, approval_request_id=pending.request_id)
            yield [settle(item, result)]
            self.assembler.add_entry(Entry(tool_message(recipient, answer, pending.channel)))

    def _pending_call(self, outcome: Outcome | None) -> OutputItem | None:
        """The server-side call the turn ended on, if it did."""
        items = self.assembler.items
        if outcome is None or outcome.status != "completed" or self.assembler.stop is not StopReason.CALL:
            return None
        last = items[-1] if items else None
        if last is None or last.kind not in HOSTED_CALL_KINDS or not last.done or last.settled:
            return None
        return last

    async def _run(self, toolset: Toolset, call: OutputItem) -> AsyncIterator[list[ItemEvent]]:
        if self.calls >= self._max_calls or toolset.seconds_left() <= 0:
            self._refused += 1
            limit = "tool calls" if self.calls >= self._max_calls else "seconds of tool time"
            answer = f"Not run: this response has used its {limit}. Answer with what you have, without tools."
            result: ToolResult = NotRun("incomplete", toolset.container_id)
        else:
            yield [Executing(call)]
            self.calls += 1
            answer, result = await self._bounded(toolset, call)
        yield [settle(call, result)]
        recipient = f"{call.namespace}.{call.name}" if call.namespace else call.name or ""
        self.assembler.add_entry(Entry(tool_message(recipient, answer, call.channel or "commentary")))

    async def _bounded(self, toolset: Toolset, item: OutputItem) -> tuple[str, ToolResult]:
        assert item.kind in HOSTED_KINDS
        try:
            async with asyncio.timeout(max(toolset.seconds_left(), 0.001)):
                run = await toolset.run(item.kind, item.namespace, item.name, item.text)  # type: ignore[arg-type]
                return run.answer, run.result
        except TimeoutError:
            answer = "Error: the tool call ran past this response's time for tools."
            return answer, NotRun("failed", toolset.container_id)

    async def _continue(self) -> bool:
        """Start the next turn on the dialog so far; False (the outcome set) when there is no room left."""
        left = self._max_output - self.assembler.output_tokens
        dialog = [*self._plan.built.dialog, *self.assembler.entries]
        try:
            plan = await plan_continuation(self._services, self._plan, self._spec, dialog, left) if left > 0 else None
        except ApiError:  # the dialog no longer fits the context
            plan = None
        if plan is None or plan.max_new_tokens <= 0:
            self._outcome = Outcome("incomplete", incomplete_reason="max_output_tokens")
            return False
        self._earlier_prompt += self.turn.prompt_tokens if self.turn.outcome is not None else 0
        self._earlier_cached += self.turn.cached_tokens if self.turn.outcome is not None else 0
        self.assembler.next_turn()
        self.turn = self._start(plan, self.assembler)
        return True


def settle(item: OutputItem, result: ToolResult | None = None) -> Settled:
    item.settled, item.result = True, result
    return Settled(item)


def _cite(batch: list[ItemEvent], toolset: Toolset) -> None:
    """A finished answer gets url_citation annotations for its citations of the browser's pages."""
    assert toolset.browser is not None
    for event in batch:
        if isinstance(event, Closed) and event.item.kind == "message":
            event.item.annotations = toolset.browser.citations(event.item.text)
