"""A create request → a Job: the request read and checked, its history and tools loaded, its prompt
rendered, admitted, and its generation set up."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

import structlog
from aiohttp import web

from backends.base import Constraint, Sampling
from state import StoredResponse

from ..generation.assembler import Closed, Opened, OutputAssembler
from ..generation.loop import Generation
from ..generation.plan import Plan, off_the_loop_if_large, plan_turn, start_turn
from ..generation.prompt import PromptSpec
from ..generation.turn import Turn
from ..hosted.toolset import Toolset
from ..ids import new_id
from ..intake.json_body import body_bytes as body_size
from ..intake.json_body import parse_model, read_model
from ..observability.metrics import STATS
from ..services import SERVICES, Services
from ..tenants.service_tiers import applied_tier
from ..tenants.tenancy import key_id_of, request_id_of, tenant_of
from .compaction import compact_if_long
from .history import load_history
from .hosted_tools import hosted_toolset, pending_approvals, with_hosted_tools
from .input import checked_tools, item_dicts, prompt_spec
from .job import Job
from .models.request import REQUEST_TAGS, ResponsesRequest
from .precheck import check_create, check_options, wants_logprobs
from .record_keeper import RecordKeeper
from .tools import OfferedTools

log = structlog.get_logger("gateway.responses")


async def request_prompt(
    services: Services,
    tenant: str,
    req: ResponsesRequest,
    body_bytes: int | None,
    held: Mapping[str, StoredResponse] | None = None,
) -> tuple[PromptSpec, OfferedTools, Constraint, Toolset | None]:
    """What a create (or an input_tokens count) of this request renders: its checked tools and constraint,
    its history, its server-side tools and the prompt spec made of them. `held`: responses a WebSocket keeps
    for its own continuations (stored or not)."""
    limits = services.settings.limits.for_tenant(tenant)
    tools, constraint = await off_the_loop_if_large(services, tenant, body_bytes, lambda: checked_tools(req, limits))
    history = await load_history(services, tenant, req, held)
    toolset, hosted_not_offered = await hosted_toolset(services.hosted, tenant, req, history.previous_output)
    left_out = {*tools.not_offered, *hosted_not_offered}
    tools.not_offered = [tool.type for tool in req.tools if tool.type in left_out]  # in request order
    if tools.not_offered:
        log.info("tools_not_offered", types=sorted(set(tools.not_offered)))
    if req.tool_choice != "none":
        constraint = with_hosted_tools(req, constraint, toolset)
    unseal = lambda blob, purpose: services.sealer.open(tenant, blob, purpose)  # noqa: E731
    return prompt_spec(history.with_input(req), tools, history.dialog, unseal, toolset), tools, constraint, toolset


async def prepare(
    request: web.Request,
    body: dict[str, Any] | None = None,
    body_bytes: int | None = None,
    held: Mapping[str, StoredResponse] | None = None,
) -> Job:
    """A create from the request's JSON body, or (a WebSocket's `response.create`) from `body`."""
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    limits = services.settings.limits.for_tenant(tenant)
    if body is None:
        check = partial(check_create, limits=limits, capabilities=services.capabilities)
        req = await read_model(request, tenant, ResponsesRequest, REQUEST_TAGS, check)
        body_bytes = body_size(request)
    else:
        req = parse_model(body, ResponsesRequest, REQUEST_TAGS)
    backend = services.backend_for(req.model)
    check_options(req, backend.capabilities)
    spec, tools, constraint, toolset = await request_prompt(services, tenant, req, body_bytes, held)
    compacted = None
    if req.context_management:
        spec, compacted = await compact_if_long(services, request, tenant, req, spec, body_bytes)
    max_output = req.max_output_tokens or limits.max_output_tokens
    plan = await plan_turn(services, tenant, backend, spec, max_output, body_bytes)
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
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
    )
    request_id = request_id_of(request, response_id)
    tier = applied_tier(req.service_tier, limits, backend, request)
    stats = request.get(STATS)
    routing = tools.routing
    if toolset is not None:
        routing = dataclasses.replace(routing, hosted=toolset.kinds, approvals=toolset.approvals)

    # text deltas for a stream's events: a streamed or background response (streamed again later) or a WebSocket's
    listened = req.stream or req.background or body is not None

    def start(plan: Plan, assembler: OutputAssembler | None = None) -> Turn:
        """The first turn, or (with the shared assembler) one after a server-side tool answered: a required
        or named tool choice holds for the first sampling only, as the call it forced has been made."""
        observer = services.metrics.turn_observer(req.model, tenant, stats)  # each turn its own timings
        forced = assembler is not None and constraint.tools == "required"
        return start_turn(
            services,
            tenant,
            plan,
            sampling,
            dataclasses.replace(constraint, tools="any", tool_names=()) if forced else constraint,
            request_id,
            observer,
            routing,
            req.prompt_cache_key,
            assembler,
            (req.top_logprobs or 0) if wants_logprobs(req) else None,
            deltas=listened,
            tier=tier,
        )

    max_calls = min(
        req.max_tool_calls or services.settings.hosted_tools.max_calls, services.settings.hosted_tools.max_calls
    )
    first = start(plan)
    opening = []
    if compacted is not None:  # the summary's sealed item opens the output, for the client to carry on with
        item = first.assembler.add("compaction", parts=[compacted], done=True)
        opening = [Opened(item), Closed(item)]
    generation = Generation(services, first, plan, spec, start, toolset, max_calls, approvals, opening)
    settings = services.settings
    keeper = RecordKeeper(
        services.store, tenant, response_id, settings.record_lease_s, time.time() + settings.store_ttl_s
    )
    return Job(
        services=services,
        request=req,
        tenant=tenant,
        response_id=response_id,
        created_at=int(time.time()),
        dialog=plan.built.dialog,
        input_items=item_dicts(req.input),
        generation=generation,
        request_id=request_id,
        ticket=ticket,
        keeper=keeper,
        not_offered=tools.not_offered,
        conversation_id=req.conversation_id,
        key_id=key_id_of(request),
        service_tier=tier,
    )
