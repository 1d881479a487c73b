"""Chat Completions shapes of the assembler's items: per-choice deltas, the final message, usage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..generation.assembler import Closed, Delta, ItemEvent, Opened
from ..generation.turn import Turn
from .stop_sequences import StopMatcher

ChatDelta = tuple[dict[str, Any], list[dict[str, Any]] | None]


@dataclass(slots=True)
class Choice:
    """One of the `n` answers: its turn and what has been shown of it."""

    index: int
    turn: Turn
    stops: StopMatcher
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # the shown answer's tokens', when asked
    _call_slots: dict[str, int] = field(default_factory=dict)
    _held: list[dict[str, Any]] = field(default_factory=list)  # tokens of text the stop matcher holds back

    def deltas(self, event: ItemEvent) -> list[ChatDelta]:
        """The delta objects this item event adds to the stream (possibly none), each with the logprobs of the
        answer's tokens it shows (None for what has none: reasoning, calls, preambles, or none asked)."""
        item = event.item
        if item.kind == "function_call":
            if isinstance(event, Opened):
                slot = len(self.tool_calls)
                self._call_slots[item.id] = slot
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": ""}}
                self.tool_calls.append(call)
                return [({"tool_calls": [{"index": slot, **call, "function": dict(call["function"])}]}, None)]
            if isinstance(event, Delta):
                slot = self._call_slots[item.id]
                self.tool_calls[slot]["function"]["arguments"] += event.text
                return [({"tool_calls": [{"index": slot, "function": {"arguments": event.text}}]}, None)]
            return []
        if item.kind == "reasoning":
            if isinstance(event, Delta):
                self.reasoning.append(event.text)
                return [({"reasoning": event.text}, None)]
            return []
        if isinstance(event, Delta):
            shown = self.stops.feed(event.text)
            if event.logprobs:
                self._held.extend(event.logprobs)
        elif isinstance(event, Closed):
            shown = self.stops.flush()
        else:
            shown = ""
        if not shown:
            return []
        self.content.append(shown)
        scored = None
        if item.logprobs is not None:  # text cut at a stop sequence leaves its tokens out
            scored, self._held = self._held, []
            self.logprobs.extend(scored)
        return [({"content": shown}, scored)]

    @property
    def finish_reason(self) -> str:
        if self.stops.stopped:
            return "stop"
        if self.tool_calls:
            return "tool_calls"
        outcome = self.turn.outcome
        return "length" if outcome is not None and outcome.status == "incomplete" else "stop"

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content or not self.tool_calls else None,
            "refusal": None,
            "reasoning": "".join(self.reasoning) or None,
        }
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def usage(choices: list[Choice]) -> dict[str, Any]:
    prompt = choices[0].turn.prompt_tokens
    completion = sum(choice.turn.assembler.output_tokens for choice in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": choices[0].turn.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": sum(c.turn.assembler.reasoning_tokens for c in choices)},
    }
