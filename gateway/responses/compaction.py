"""Compaction: the model itself summarises the conversation so far, and the summary comes back sealed in a
`compaction` item, for the client to send instead of it (`POST /v1/responses/compact`, in api.py), or replaces
the earlier turns of a create whose prompt passes its `context_management` threshold (`compact_if_long`).

The summarising prompt is the conversation as a create would render it (history, recovered reasoning, earlier
summaries) with its instructions replaced by COMPACTION_INSTRUCTIONS and COMPACT_ASK as the last user turn, at
low reasoning effort, no tools. The summary may use at most half the tokens of the prompt it replaces (and
MAX_SUMMARY_TOKENS), so the compacted conversation is always shorter. A compaction item given back as input
becomes a user turn, under SUMMARY_HEADING, where it stands (docs: README, *Compaction*).
"""

from __future__ import annotations

import dataclasses
from contextlib import aclosing
from typing import Any

import structlog
from aiohttp import web

from backends.base import Constraint, Sampling
from harmony import ReasoningEffort, Role

from ..errors import ApiError
from ..generation.dialog import Instruction, Said
from ..generation.plan import count_prompt, plan_turn, start_turn
from ..generation.prompt import SUMMARY_HEADING, PromptSpec, dialog_entries, entry_text, summary_entry
from ..ids import new_id
from ..intake.json_body import body_bytes
from ..observability.metrics import STATS
from ..services import Services
from ..tenants.tenancy import request_id_of
from .input import SUMMARY_PURPOSE
from .models.request import ResponsesRequest
from .shape import usage

log = structlog.get_logger("gateway.responses.compaction")

COMPACTION_INSTRUCTIONS = (
    "You are compacting a long conversation so that it can go on in less space. Write a summary of everything "
    "in it that you will need to carry on: the user's goals and requests, facts and figures established, "
    "decisions made, the tools called and what they returned that still matters, the files, code or data in "
    "play, and what remains to be done. Be specific and complete; leave out pleasantries and what no longer "
    "matters. Write only the summary."
)
COMPACT_ASK = "Write the summary of our conversation so far now, as instructed."
MAX_SUMMARY_TOKENS = 4096


async def summarise(
    services: Services, request: web.Request, tenant: str, model: str, spec: PromptSpec, replaced: int
) -> tuple[str, dict[str, Any]]:
    """The model's summary of `spec`'s conversation (at most half of `replaced` tokens), and the pass's usage."""
    summarising = dataclasses.replace(
        spec,
        history=[entry for entry in spec.history if entry.message.role is not Role.DEVELOPER],
        items=[*(item for item in spec.items if not isinstance(item, Instruction)), Said("user", COMPACT_ASK, "input")],
        instructions=[COMPACTION_INSTRUCTIONS],
        tools=[],
        namespaces=[],
        builtin=[],
        response_format=None,
        effort=ReasoningEffort.LOW,
    )
    backend = services.backend_for(model)
    budget = min(MAX_SUMMARY_TOKENS, max(16, replaced // 2))
    plan = await plan_turn(services, tenant, backend, summarising, budget, body_bytes(request))
    ticket = await services.admission.admit(
        tenant, prompt_tokens=len(plan.built.tokens), max_output_tokens=plan.max_new_tokens, choices=1, stream=False
    )
    observer = services.metrics.turn_observer(model, tenant, request.get(STATS))
    request_id = request_id_of(request, new_id("req_"))
    turn = start_turn(services, tenant, plan, Sampling(temperature=0.0), Constraint(), request_id, observer)
    try:
        async with aclosing(turn.events()) as events:
            async for _ in events:
                pass
    finally:
        await ticket.settle(len(plan.built.tokens) + turn.output_tokens)
    outcome = turn.outcome
    if outcome is not None and outcome.status == "failed":
        raise ApiError(
            502, outcome.error_message or "The model backend failed.", code="backend_error", kind="server_error"
        )
    items = turn.assembler.items
    summary = "".join(item.text for item in items if item.kind == "message" and not item.preamble).strip()
    if not summary:
        raise ApiError(
            502,
            f"The model wrote no summary within {plan.max_new_tokens} tokens; the conversation was not compacted.",
            code="compaction_failed",
            kind="server_error",
        )
    spent = usage(turn.prompt_tokens, turn.cached_tokens, turn.output_tokens, turn.assembler.reasoning_tokens)
    return summary, spent


def user_messages(spec: PromptSpec) -> list[dict[str, Any]]:
    """The conversation's user messages, in order (history, then this request's), as output items."""
    texts = [entry_text(entry) for entry in spec.history if entry.message.role is Role.USER]
    texts = [text for text in texts if not text.startswith(SUMMARY_HEADING)]  # an earlier summary is folded in
    texts += [item.text for item in spec.items if isinstance(item, Said) and item.role == "user"]
    return [
        {
            "id": new_id("msg_"),
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": text}],
        }
        for text in texts
    ]


async def compact_if_long(
    services: Services,
    request: web.Request,
    tenant: str,
    req: ResponsesRequest,
    spec: PromptSpec,
    body_bytes: int | None,
) -> tuple[PromptSpec, str | None]:
    """A create's `context_management`: when the prompt passes `compact_threshold` tokens (default: three
    quarters of the model's context), everything before the conversation's last user message is summarised
    (as `/compact` does) and replaced by the summary; returns the spec to answer and the sealed summary (None
    when nothing was compacted)."""
    assert req.context_management
    backend = services.backend_for(req.model)
    threshold = req.context_management[0].compact_threshold or backend.capabilities.context_length * 3 // 4
    tokens = await count_prompt(services, tenant, spec, body_bytes)
    if tokens <= threshold:
        return spec, None
    users = [index for index, item in enumerate(spec.items) if isinstance(item, Said) and item.role == "user"]
    if users:  # the last user turn is in this request: the history and the input before it go
        earlier = dataclasses.replace(spec, items=spec.items[: users[-1]])
        kept_history, kept_items = [], spec.items[users[-1] :]
    else:  # the input continues a turn (a tool's output): it goes on from the history's last user message
        asked = [index for index, entry in enumerate(spec.history) if entry.message.role is Role.USER]
        cut = asked[-1] if asked else 0
        earlier = dataclasses.replace(spec, items=[], history=spec.history[:cut])
        kept_history, kept_items = spec.history[cut:], spec.items
    if not earlier.items and not earlier.history:
        return spec, None
    summary, _ = await summarise(services, request, tenant, req.model, earlier, tokens)
    standing = [  # the earlier turns' system and developer messages are not summarised: they stay as they are
        entry
        for entry in [*earlier.history, *dialog_entries(earlier.items, earlier.history)]
        if entry.message.role is Role.DEVELOPER
    ]
    compacted = dataclasses.replace(spec, history=[*standing, summary_entry(summary), *kept_history], items=kept_items)
    log.info("context_compacted", tokens=tokens, threshold=threshold)
    return compacted, services.sealer.seal(tenant, summary, SUMMARY_PURPOSE)
