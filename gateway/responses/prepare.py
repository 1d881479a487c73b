"""A create request → a Job: the request read and checked, its history and tools loaded, its prompt
rendered, admitted, and its generation set up."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import structlog
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from backends.base import Sampling
from state import StoredResponse, StoreUnavailable

from ..assembler import OutputAssembler
from ..conversations.api import conversation_items
from ..dialog import Entry
from ..errors import invalid, not_found, unavailable
from ..hosted.loop import Generation
from ..ids import new_id
from ..json_body import read_model
from ..metrics import STATS
from ..pipeline import Plan, plan_turn, start_turn
from ..services import SERVICES, Services
from ..tenants.tenancy import request_id_of, tenant_of
from ..turn import Turn
from .hosted_tools import hosted_toolset, pending_approvals
from .input import check_tenant_caps, constraint_for, item_dicts, prompt_spec
from .job import TERMINAL, Job
from .models import REQUEST_TAGS, InputItem, MessageInput, ResponsesRequest
from .record_keeper import RecordKeeper
from .tools import offered_tools

STORED_ITEMS = TypeAdapter(list[InputItem])

log = structlog.get_logger("gateway.responses")


async def _with_conversation(services: Services, tenant: str, req: ResponsesRequest) -> ResponsesRequest:
    """The request with its conversation's items in front of its input (what the prompt is built from)."""
    conversation_id = req.conversation_id
    if conversation_id is None:
        return req
    if req.previous_response_id is not None:
        raise invalid("conversation", "conversation and previous_response_id cannot be used together.")
    stored = await conversation_items(services, tenant, conversation_id, "conversation")
    try:
        earlier = STORED_ITEMS.validate_python(stored)
    except ValidationError as exc:
        raise invalid(
            "conversation", f"Conversation '{conversation_id}' holds an item this gateway cannot read."
        ) from exc
    own = [MessageInput(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    return req.model_copy(update={"input": [*earlier, *own]})


async def load_history(
    services: Services, tenant: str, request: ResponsesRequest
) -> tuple[list[Entry], list[dict[str, Any]]]:
    """The previous response's dialog and its output items (what its tools listed and where they ran)."""
    if request.previous_response_id is None:
        return [], []
    record = await load_record(services, tenant, request.previous_response_id, "previous_response_id")
    status = record.response.get("status")
    if status not in TERMINAL:
        raise invalid("previous_response_id", f"Response '{record.id}' is still {status}; wait for it to finish.")
    output = record.response.get("output")
    return [Entry.from_data(data) for data in record.conversation], output if isinstance(output, list) else []


async def load_record(services: Services, tenant: str, response_id: str, param: str) -> StoredResponse:
    try:
        record = await services.store.load(tenant, response_id)
    except StoreUnavailable as exc:
        raise unavailable("The response store is unavailable; try again.") from exc
    if record is None:
        raise not_found(param, f"Response with id '{response_id}' not found.")
    return record


async def prepare(request: web.Request) -> Job:
    services = request.app[SERVICES]
    req = await read_model(request, ResponsesRequest, REQUEST_TAGS)
    backend = services.backend_for(req.model)
    wants_logprobs = "message.output_text.logprobs" in req.include or bool(req.top_logprobs)
    if wants_logprobs and not backend.capabilities.logprobs:
        param = "top_logprobs" if req.top_logprobs else "include"
        raise invalid(param, "This model's backend does not return logprobs.", "unsupported_parameter")
    if req.background and not req.store:
        raise invalid("background", "background responses need store: true.", "unsupported_parameter")
    tenant = tenant_of(request)
    limits = services.settings.limits.for_tenant(tenant)
    tools = offered_tools(req)
    check_tenant_caps(req, tools, limits)
    history, previous_output = await load_history(services, tenant, req)
    toolset, hosted_not_offered = await hosted_toolset(services.hosted, tenant, req, previous_output)
    left_out = {*tools.not_offered, *hosted_not_offered}
    tools.not_offered = [tool.type for tool in req.tools if tool.type in left_out]  # in request order
    if tools.not_offered:
        log.info("tools_not_offered", types=sorted(set(tools.not_offered)))
    with_earlier = await _with_conversation(services, tenant, req)
    spec = prompt_spec(with_earlier, tools, history, lambda blob: services.sealer.open(tenant, blob), toolset)
    constraint = constraint_for(req, tools)
    max_output = req.max_output_tokens or limits.max_output_tokens
    plan = await plan_turn(services, tenant, backend, spec, max_output, request.content_length)
    approvals = pending_approvals(spec.items, plan.built.dialog, toolset)
    ticket = await services.admission.admit(
        tenant,
        prompt_tokens=len(plan.built.tokens),
        max_output_tokens=plan.max_new_tokens,
        choices=1,
        stream=req.stream,
        background=req.background,
    )
    response_id = new_id("resp_")
    sampling = Sampling(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
    )
    request_id = request_id_of(request, response_id)
    stats = request.get(STATS)
    routing = tools.routing
    if toolset is not None:
        routing = dataclasses.replace(routing, hosted=toolset.kinds, approvals=toolset.approvals)

    def start(plan: Plan, assembler: OutputAssembler | None = None) -> Turn:
        observer = services.metrics.turn_observer(req.model, tenant, stats)  # each turn its own timings
        return start_turn(
            services, tenant, plan, sampling, constraint, request_id, observer, routing, req.prompt_cache_key, assembler
        )

    max_calls = min(
        req.max_tool_calls or services.settings.hosted_tools.max_calls, services.settings.hosted_tools.max_calls
    )
    generation = Generation(services, start(plan), plan, spec, start, toolset, max_calls, approvals)
    settings = services.settings
    keeper = RecordKeeper(
        services.store, tenant, response_id, settings.record_lease_s, time.time() + settings.store_ttl_s
    )
    return Job(
        services,
        req,
        tenant,
        response_id,
        int(time.time()),
        plan.built.dialog,
        item_dicts(req.input),
        generation,
        request_id,
        ticket,
        keeper,
        tools.not_offered,
        req.conversation_id,
    )
