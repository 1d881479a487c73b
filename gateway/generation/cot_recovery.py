"""CoT recovery by tool-call id: the chain of thought clients drop when they send back their tool calls.

After a turn that ends in tool calls, its analysis is stored under each call id the gateway generated
(tenant-scoped, with the store's TTL). When a later request replays those calls (same id, name and
arguments, compared as parsed JSON: clients re-serialize them) with no reasoning of its own in that
assistant step, the stored analysis is put back in front of them. Reasoning the client sends always
wins. Recovery is best-effort: a store outage only means the prompt goes without it.
"""

from __future__ import annotations

import asyncio
import json

import structlog

from state import ResponseStore, StoredCot, StoreUnavailable

from .assembler import OutputItem
from .dialog import Call, DialogItem, Entry, Said, Thought

log = structlog.get_logger("gateway.generation.cot_recovery")


def _steps(items: list[DialogItem]) -> list[tuple[int, int]]:
    """[start, end) ranges of assistant steps: runs of assistant-side items between user/tool items."""
    ranges, start = [], None
    for index, item in enumerate(items):
        assistant_side = isinstance(item, Thought | Call) or (isinstance(item, Said) and item.role == "assistant")
        if assistant_side and start is None:
            start = index
        elif not assistant_side and start is not None:
            ranges.append((start, index))
            start = None
    if start is not None:
        ranges.append((start, len(items)))
    return ranges


async def recover_cot(store: ResponseStore, tenant: str, items: list[DialogItem]) -> list[DialogItem]:
    """The items with stored CoT inserted at the start of each assistant step that has calls but no reasoning."""
    wanted: dict[int, Call] = {}  # step start → the step's first call
    for start, end in _steps(items):
        step = items[start:end]
        calls = [item for item in step if isinstance(item, Call)]
        if calls and not any(isinstance(item, Thought) for item in step):
            wanted[start] = calls[0]
    if not wanted:
        return items
    try:  # one concurrent lookup per step, not a round trip after another
        found = await asyncio.gather(*(store.find_cot(tenant, call.call_id) for call in wanted.values()))
    except StoreUnavailable:
        log.warning("cot_recovery_unavailable")
        return items
    inserts: dict[int, list[DialogItem]] = {}
    for (start, call), stored in zip(wanted.items(), found, strict=True):
        if (
            stored is not None
            and stored.name == call.qualified_name
            and _same_arguments(stored.arguments, call.arguments)
        ):
            texts = (Entry.from_data(data).message.text for data in stored.reasoning)
            inserts[start] = [Thought(text, call.param) for text in texts if text]
    if not inserts:
        return items
    out: list[DialogItem] = []
    for index, item in enumerate(items):
        out += inserts.get(index, [])
        out.append(item)
    return out


def _same_arguments(stored: str, sent: str) -> bool:
    """Equal as text, or as parsed JSON (key order and spacing are the client's: `JSON.stringify`,
    `json.dumps` of parsed arguments); a freeform input compares as text."""
    if stored == sent:
        return True
    try:
        return json.loads(stored) == json.loads(sent)
    except (ValueError, RecursionError):
        return False


async def index_cot(
    store: ResponseStore, tenant: str, output: list[OutputItem], entries: list[Entry], response_id: str | None = None
) -> None:
    """Remember this turn's analysis under each tool call it ended in (tied to the stored response, if any)."""
    calls = [item for item in output if item.is_call and item.done and item.complete]
    if not calls:
        return
    reasoning = [entry.to_data() for entry in entries if entry.message.channel == "analysis"]
    records = [
        StoredCot(call.call_id or "", tenant, call.qualified_name or "", call.text, reasoning)
        for call in calls
        if call.call_id
    ]
    try:
        await store.index_tool_calls(records, response_id)
    except StoreUnavailable:
        log.warning("cot_index_unavailable")
