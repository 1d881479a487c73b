"""Responses API shapes of the assembler's items, the response object and the stream events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..generation.assembler import Closed, Delta, Executing, ItemEvent, Opened, OutputItem, Settled

Sealer = Callable[[OutputItem], str | None]  # encrypted_content for a finished reasoning item, or None


def item_json(item: OutputItem, seal: Sealer | None = None) -> dict[str, Any]:
    """An output item as the API returns it; in progress until the assembler closed it."""
    status = "completed" if item.done and item.complete else "incomplete" if item.done else "in_progress"
    if item.kind == "function_call":
        call = {
            "type": "function_call",
            "id": item.id,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.text,
            "status": status,
        }
        return call if item.namespace is None else {**call, "namespace": item.namespace}
    if item.kind == "custom_tool_call":
        call = {
            "type": "custom_tool_call",
            "id": item.id,
            "call_id": item.call_id,
            "name": item.name,
            "input": item.text,
        }
        return call if item.namespace is None else {**call, "namespace": item.namespace}
    if item.is_hosted:
        return _hosted_json(item, status)
    if item.kind == "reasoning":
        data: dict[str, Any] = {
            "type": "reasoning",
            "id": item.id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": item.text}] if item.done else [],
            "status": status,
        }
        sealed = seal(item) if item.done and seal is not None else None
        if sealed is not None:
            data["encrypted_content"] = sealed
        return data
    return {
        "type": "message",
        "id": item.id,
        "role": "assistant",
        "status": status,
        "phase": "commentary" if item.preamble else "final_answer",
        "content": [_text_part(item.text, item.annotations)] if item.done else [],
    }


def _hosted_json(item: OutputItem, status: str) -> dict[str, Any]:
    """A server-side tool's item: in progress until the loop settled it, then with its result."""
    detail = item.detail
    base: dict[str, Any] = {"type": item.kind, "id": item.id}
    if item.kind == "mcp_list_tools":
        return {**base, "server_label": item.namespace, "tools": detail.get("tools", []), "error": detail.get("error")}
    if item.kind == "mcp_approval_request":
        return {**base, "server_label": item.namespace, "name": item.name, "arguments": item.text}
    final = detail.get("status", status) if item.settled else "in_progress"
    if item.kind == "web_search_call":
        return {**base, "status": final, "action": detail.get("action") or {"type": "search"}}
    if item.kind == "code_interpreter_call":
        return {
            **base,
            "status": final,
            "code": item.text,
            "container_id": detail.get("container_id", ""),
            "outputs": detail.get("outputs") if item.settled else None,
        }
    return {
        **base,
        "status": final,
        "server_label": item.namespace,
        "name": item.name,
        "arguments": item.text,
        "output": detail.get("output"),
        "error": detail.get("error"),
        "approval_request_id": detail.get("approval_request_id"),
    }


def _text_part(text: str, annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": []}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


_TEXT_DELTAS = {"message": "response.output_text.delta", "reasoning": "response.reasoning_text.delta"}


class StreamEvents:
    """Numbers the stream's events and turns item events into Responses SSE payloads."""

    def __init__(self, seal: Sealer | None = None) -> None:
        self.sequence_number = 0
        self._seal = seal

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return payload

    def lifecycle(self, kind: str, response: dict[str, Any]) -> dict[str, Any]:
        return self.event(kind, response=response)

    def for_item_event(self, event: ItemEvent) -> list[dict[str, Any]]:
        item = event.item
        if type(event) is Delta and item.kind in _TEXT_DELTAS:  # most events: one token of text, built directly
            number = self.sequence_number
            self.sequence_number = number + 1
            payload = {
                "type": _TEXT_DELTAS[item.kind],
                "sequence_number": number,
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "delta": event.text,
            }
            if item.kind == "message":
                payload["logprobs"] = []
            return [payload]
        at = {"item_id": item.id, "output_index": item.index}
        if item.is_hosted:
            return self._hosted(event, at)
        if isinstance(event, Opened):
            out = [self.event("response.output_item.added", output_index=item.index, item=item_json(item))]
            if item.kind == "message":
                out.append(self.event("response.content_part.added", **at, content_index=0, part=_text_part("")))
            elif item.kind == "reasoning":
                out.append(self.event("response.content_part.added", **at, content_index=0, part=_reasoning_part("")))
            return out
        if isinstance(event, Delta):
            if item.kind == "message":
                return [self.event("response.output_text.delta", **at, content_index=0, delta=event.text, logprobs=[])]
            if item.kind == "reasoning":
                return [self.event("response.reasoning_text.delta", **at, content_index=0, delta=event.text)]
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
                self.event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                self.event(
                    "response.content_part.done", **at, content_index=0, part=_text_part(text, item.annotations)
                ),
            ]
        elif item.kind == "reasoning":
            out = [
                self.event("response.reasoning_text.done", **at, content_index=0, text=text),
                self.event("response.content_part.done", **at, content_index=0, part=_reasoning_part(text)),
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
            failed = item.detail.get("status") == "failed" or item.detail.get("error")
            ending = "failed" if failed and kind in ("mcp_call", "mcp_list_tools") else "completed"
            out.append(self.event(f"response.{kind}.{ending}", **at))
        out.append(self.event("response.output_item.done", output_index=item.index, item=item_json(item)))
        return out
