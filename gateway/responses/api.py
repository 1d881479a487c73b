"""The Responses API routes: create (plain, stream, background), get, delete, cancel, input_items."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from state import StoreUnavailable

from ..errors import ApiError, invalid, not_found, unavailable
from ..generation.plan import count_prompt
from ..ids import new_id
from ..intake.json_body import body_bytes, parse_model, read_json, read_model
from ..json_out import json_response
from ..pagination import page
from ..services import SERVICES
from ..sse import ClientGone, end_stream, frame, open_stream, pump
from ..tenants.tenancy import tenant_of
from .compaction import SUMMARY_PURPOSE, summarise, user_messages
from .execution import Feed, run_job, start_job
from .history import load_record
from .job import Job
from .models.request import REQUEST_TAGS, CompactRequest, ResponsesRequest
from .prepare import prepare, request_prompt
from .resume import stream_again
from .runs import ListenerTooSlow, Run
from .websocket import SOCKETS, Sockets, responses_socket

log = structlog.get_logger("gateway.responses")
CANCELLED_RUN_WAIT_S = 5.0


async def _frames(run: Run) -> AsyncIterator[bytes]:
    try:
        async for batch in run.log.follow():
            yield b"".join([frame(payload, payload["type"]) for payload in batch])
    except ListenerTooSlow:
        raise ClientGone from None


async def _stream(request: web.Request, job: Job) -> web.StreamResponse:
    run = start_job(job, stream=True)
    response = await open_stream(request, job.headers)
    try:
        await pump(request, response, _frames(run))
    except ClientGone:
        run.log.detach()
        if not job.request.background and run.task is not None:
            run.task.cancel()  # nobody is listening: stop the generation
            # and let it count its tokens before this request's log line and stats are written (bounded)
            await asyncio.wait({run.task}, timeout=CANCELLED_RUN_WAIT_S)
        return response
    await end_stream(request, response)
    return response


async def create_response(request: web.Request) -> web.StreamResponse:
    job = await prepare(request)
    if job.request.stream or job.request.background:  # the client knows the id before the end: GET finds it
        await job.save_running(job.first_status)
        if job.request.background and not job.keeper.stored:  # nowhere to read its result from: refuse now
            await job.ticket.settle(0)
            raise unavailable("The response store is unavailable, so a background response cannot be kept; retry.")
    if job.request.stream:
        return await _stream(request, job)
    if job.request.background:
        start_job(job, stream=False)
        return json_response(job.response("queued"), headers=job.headers)
    final = await run_job(job, Feed.off())
    return json_response(final, headers=job.headers)


async def get_response(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    record = await load_record(services, tenant_of(request), request.match_info["response_id"], "response_id")
    if request.query.get("stream") == "true":
        return await stream_again(request, services, record)
    return json_response(record.response)


async def delete_response(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    response_id = request.match_info["response_id"]
    services.runs.cancel(tenant, response_id)
    try:
        deleted = await services.store.delete(tenant, response_id)
    except StoreUnavailable as exc:
        raise unavailable("The response store is unavailable; try again.") from exc
    if not deleted:
        raise not_found("response_id", f"Response with id '{response_id}' not found.")
    try:
        await services.events.delete(tenant, response_id)
    except StoreUnavailable:  # unreachable anyway: every read of them starts from the (deleted) record
        log.warning("events_not_deleted", response_id=response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    response_id = request.match_info["response_id"]
    record = await load_record(services, tenant, response_id, "response_id")
    response = record.response
    if not response.get("background"):
        raise invalid("response_id", "Only responses created with background: true can be cancelled.")
    status = response.get("status")
    if status in ("queued", "in_progress"):
        response["status"] = "cancelled"
        try:
            await services.store.save(record)
        except StoreUnavailable as exc:
            raise unavailable("The response store is unavailable; try again.") from exc
        run = services.runs.get(tenant, response_id)
        if services.runs.cancel(tenant, response_id) and run is not None and run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)
            record = await load_record(services, tenant, response_id, "response_id")
            response = record.response
    elif status != "cancelled":
        raise invalid("response_id", f"Response '{response_id}' is already {status} and cannot be cancelled.")
    return json_response(response)


async def list_input_items(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    record = await load_record(services, tenant_of(request), request.match_info["response_id"], "response_id")
    return json_response(page(record.input_items, request.query, f"response '{record.id}'"))


async def count_input_tokens(request: web.Request) -> web.Response:
    """The prompt a create with this body would render, counted by the same conversation builder (the
    model may be left out: every gpt-oss model has the same tokenizer)."""
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    body = await read_json(request, tenant)
    if isinstance(body, dict) and body.get("model") is None:
        body = {**body, "model": next(iter(services.backends))}
    req = parse_model(body, ResponsesRequest, REQUEST_TAGS)
    services.backend_for(req.model)
    spec, *_ = await request_prompt(services, tenant, req, body_bytes(request))
    count = await count_prompt(services, tenant, spec, body_bytes(request))
    return json_response({"object": "response.input_tokens", "input_tokens": count})


async def compact_response(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    req = await read_model(request, tenant, CompactRequest, REQUEST_TAGS)
    services.backend_for(req.model)
    conversation = ResponsesRequest(
        model=req.model,
        input=req.input,
        instructions=req.instructions,
        previous_response_id=req.previous_response_id,
        prompt_cache_key=req.prompt_cache_key,
        store=False,
    )
    spec, *_ = await request_prompt(services, tenant, conversation, body_bytes(request))
    replaced = await count_prompt(services, tenant, spec, body_bytes(request))
    summary, spent = await summarise(services, request, tenant, req.model, spec, replaced)
    sealed = services.sealer.seal(tenant, summary, SUMMARY_PURPOSE)
    output = [*user_messages(spec), {"id": new_id("cmp_"), "type": "compaction", "encrypted_content": sealed}]
    body = {
        "id": new_id("resp_"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": spent,
    }
    return json_response(body)


async def unknown_route(request: web.Request) -> web.Response:
    raise ApiError(404, f"Unknown route: {request.method} {request.path}.", code="not_found")


def add_routes(app: web.Application) -> None:
    app[SOCKETS] = Sockets()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses", responses_socket)
    app.router.add_post("/v1/responses/input_tokens", count_input_tokens)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.router.add_route("*", "/v1/responses/{tail:.*}", unknown_route)  # last: a 404, not a 405
