"""`POST /v1/responses/compact`: the model itself summarises the conversation so far, and the summary comes back
sealed in a `compaction` item, with the conversation's user messages, for the client to send instead of it.

The summarising prompt is the conversation as a create would render it (history, recovered reasoning, earlier
summaries) with its instructions replaced by COMPACTION_INSTRUCTIONS and COMPACT_ASK as the last user turn, at
low reasoning effort, no tools. The summary may use at most half the tokens of the prompt it replaces (and
MAX_SUMMARY_TOKENS), so the compacted conversation is always shorter. A compaction item given back as input
joins the developer instructions under SUMMARY_HEADING (docs: README, *Compaction*).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import aclosing
from typing import Any

from aiohttp import web

from backends.base import Constraint, Sampling
from harmony import ReasoningEffort, Role

from ..errors import ApiError
from ..generation.dialog import Said
from ..generation.plan import count_prompt, plan_turn, start_turn
from ..generation.prompt import PromptSpec
from ..ids import new_id
from ..json_body import read_model
from ..json_out import json_response
from ..metrics import STATS
from ..services import SERVICES, Services
from ..tenants.tenancy import request_id_of, tenant_of
from .input import SUMMARY_HEADING, SUMMARY_PURPOSE
from .models import REQUEST_TAGS, CompactRequest, ResponsesRequest
from .prepare import request_prompt
from .shape import usage

COMPACTION_INSTRUCTIONS = (
    "You are compacting a long conversation so that it can go on in less space. Write a summary of everything "
    "in it that you will need to carry on: the user's goals and requests, facts and figures established, "
    "decisions made, the tools called and what they returned that still matters, the files, code or data in "
    "play, and what remains to be done. Be specific and complete; leave out pleasantries and what no longer "
    "matters. Write only the summary."
)
COMPACT_ASK = "Write the summary of our conversation so far now, as instructed."
MAX_SUMMARY_TOKENS = 4096


async def compact_response(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    req = await read_model(request, CompactRequest, REQUEST_TAGS)
    services.backend_for(req.model)
    tenant = tenant_of(request)
    conversation = ResponsesRequest(
        model=req.model,
        input=req.input,
        instructions=req.instructions,
        previous_response_id=req.previous_response_id,
        prompt_cache_key=req.prompt_cache_key,
        store=False,
    )
    spec, *_ = await request_prompt(services, tenant, conversation, request.content_length)
    replaced = await count_prompt(services, tenant, spec, request.content_length)
    summary, spent = await summarise(services, request, tenant, req, spec, replaced)
    sealed = services.sealer.seal(tenant, summary, SUMMARY_PURPOSE)
    output = [*_user_messages(spec), {"id": new_id("cmp_"), "type": "compaction", "encrypted_content": sealed}]
    body = {
        "id": new_id("resp_"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": spent,
    }
    return json_response(body)


async def summarise(
    services: Services, request: web.Request, tenant: str, req: CompactRequest, spec: PromptSpec, replaced: int
) -> tuple[str, dict[str, Any]]:
    """The model's summary of `spec`'s conversation (at most half of `replaced` tokens), and the pass's usage."""
    earlier = [text for text in spec.instructions if text.startswith(SUMMARY_HEADING)]  # summaries it folds in
    summarising = dataclasses.replace(
        spec,
        items=[*spec.items, Said("user", COMPACT_ASK, "input")],
        instructions=[COMPACTION_INSTRUCTIONS, *earlier],
        tools=[],
        namespaces=[],
        builtin=[],
        response_format=None,
        effort=ReasoningEffort.LOW,
    )
    backend = services.backend_for(req.model)
    budget = min(MAX_SUMMARY_TOKENS, max(16, replaced // 2))
    plan = await plan_turn(services, tenant, backend, summarising, budget, request.content_length)
    ticket = await services.admission.admit(
        tenant, prompt_tokens=len(plan.built.tokens), max_output_tokens=plan.max_new_tokens, choices=1, stream=False
    )
    observer = services.metrics.turn_observer(req.model, tenant, request.get(STATS))
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
    return summary, spent.model_dump()


def _user_messages(spec: PromptSpec) -> list[dict[str, Any]]:
    """The conversation's user messages, in order (history, then this request's), as output items."""
    texts = [
        "".join(part for part in entry.message.content if isinstance(part, str))
        for entry in spec.history
        if entry.message.role is Role.USER
    ]
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
