"""The Responses stream: the assembler's item events as numbered SSE payloads (their items' JSON from shape.py)."""

from __future__ import annotations

import secrets
from typing import Any, Literal

from ..generation.assembler import Closed, Delta, Executing, ItemEvent, Opened, Settled
from .shape import Sealer, item_json, reasoning_part, text_part

ReasoningEvents = Literal["reasoning_text", "reasoning"]  # OpenAI's (the SDK's) names, or the Open Responses spec's
PAD_TO = 32  # bytes: a delta and its `obfuscation` together fill a multiple of this


def obfuscation(delta: str) -> str:
    """Random characters that bring the delta's size to a multiple of PAD_TO bytes, so that an observer of
    encrypted traffic cannot read token lengths off the events' sizes (OpenAI's `obfuscation` field)."""
    size = PAD_TO - len(delta.encode()) % PAD_TO
    return secrets.token_urlsafe(size)[:size]


class StreamEvents:
    """Numbers the stream's events and turns item events into Responses SSE payloads."""

    def __init__(
        self, seal: Sealer | None = None, obfuscate: bool = True, reasoning: ReasoningEvents = "reasoning_text"
    ) -> None:
        self.sequence_number = 0
        self._seal = seal
        self._obfuscate = obfuscate  # `stream_options.include_obfuscation`, on by default as OpenAI has it
        self._reasoning = f"response.{reasoning}"  # + .delta / .done
        self._text_deltas = {"message": "response.output_text.delta", "reasoning": f"{self._reasoning}.delta"}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        if self._obfuscate and "delta" in fields:
            payload["obfuscation"] = obfuscation(fields["delta"])
        return payload

    def lifecycle(self, kind: str, response: dict[str, Any]) -> dict[str, Any]:
        return self.event(kind, response=response)

    def for_item_event(self, event: ItemEvent) -> list[dict[str, Any]]:
        item = event.item
        if type(event) is Delta and item.kind in self._text_deltas:  # most events: one token of text, built directly
            number = self.sequence_number
            self.sequence_number = number + 1
            payload = {
                "type": self._text_deltas[item.kind],
                "sequence_number": number,
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "delta": event.text,
            }
            if item.kind == "message":
                payload["logprobs"] = event.logprobs or []
            if self._obfuscate:
                payload["obfuscation"] = obfuscation(event.text)
            return [payload]
        at = {"item_id": item.id, "output_index": item.index}
        if item.is_hosted:
            return self._hosted(event, at)
        if item.kind == "compaction":  # whole from the start: added, then done
            kind = "response.output_item.added" if isinstance(event, Opened) else "response.output_item.done"
            return [self.event(kind, output_index=item.index, item=item_json(item))]
        if isinstance(event, Opened):
            out = [self.event("response.output_item.added", output_index=item.index, item=item_json(item))]
            if item.kind == "message":
                out.append(self.event("response.content_part.added", **at, content_index=0, part=text_part("")))
            elif item.kind == "reasoning":
                out.append(self.event("response.content_part.added", **at, content_index=0, part=reasoning_part("")))
            return out
        if isinstance(event, Delta):
            if item.kind == "message":
                logprobs = event.logprobs or []
                return [
                    self.event("response.output_text.delta", **at, content_index=0, delta=event.text, logprobs=logprobs)
                ]
            if item.kind == "reasoning":
                return [self.event(f"{self._reasoning}.delta", **at, content_index=0, delta=event.text)]
            if item.kind == "custom_tool_call":
                return [self.event("response.custom_tool_call_input.delta", **at, delta=event.text)]
            return [self.event("response.function_call_arguments.delta", **at, delta=event.text)]
        assert isinstance(event, Closed)
        text = item.text
        if item.kind == "message":
            out = [
                self.event(
                    "response.output_text.annotation.added",
                    **at,
                    content_index=0,
                    annotation_index=index,
                    annotation=note,
                )
                for index, note in enumerate(item.annotations)
            ]
            out += [
                self.event("response.output_text.done", **at, content_index=0, text=text, logprobs=item.logprobs or []),
                self.event(
                    "response.content_part.done",
                    **at,
                    content_index=0,
                    part=text_part(text, item.annotations, item.logprobs),
                ),
            ]
        elif item.kind == "reasoning":
            out = [
                self.event(f"{self._reasoning}.done", **at, content_index=0, text=text),
                self.event("response.content_part.done", **at, content_index=0, part=reasoning_part(text)),
            ]
        elif item.kind == "custom_tool_call":
            out = [self.event("response.custom_tool_call_input.done", **at, input=text)]
        else:
            out = [self.event("response.function_call_arguments.done", **at, name=item.name, arguments=text)]
        out.append(self.event("response.output_item.done", output_index=item.index, item=item_json(item, self._seal)))
        return out

    def _hosted(self, event: ItemEvent, at: dict[str, Any]) -> list[dict[str, Any]]:
        """A server-side tool's events: added and in progress, its input, running, then completed (or failed)."""
        item = event.item
        kind = item.kind
        if isinstance(event, Opened):
            out = [self.event("response.output_item.added", output_index=item.index, item=item_json(item))]
            if kind != "mcp_approval_request":
                out.append(self.event(f"response.{kind}.in_progress", **at))
            return out
        if isinstance(event, Delta):
            if kind == "code_interpreter_call":
                return [self.event("response.code_interpreter_call_code.delta", **at, delta=event.text)]
            if kind == "mcp_call":
                return [self.event("response.mcp_call_arguments.delta", **at, delta=event.text)]
            return []
        if isinstance(event, Closed):
            if kind == "code_interpreter_call":
                return [self.event("response.code_interpreter_call_code.done", **at, code=item.text)]
            if kind == "mcp_call":
                return [self.event("response.mcp_call_arguments.done", **at, arguments=item.text)]
            return []
        if isinstance(event, Executing):
            if kind == "web_search_call":
                return [self.event("response.web_search_call.searching", **at)]
            if kind == "code_interpreter_call":
                return [self.event("response.code_interpreter_call.interpreting", **at)]
            return []
        assert isinstance(event, Settled)
        out = []
        if kind != "mcp_approval_request":
            failed = item.result is not None and item.result.failed
            ending = "failed" if failed and kind in ("mcp_call", "mcp_list_tools") else "completed"
            out.append(self.event(f"response.{kind}.{ending}", **at))
        out.append(self.event("response.output_item.done", output_index=item.index, item=item_json(item)))
        return out
