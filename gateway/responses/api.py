"""The Responses API routes: create (plain, stream, background), get, delete, cancel, input_items."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from backends.base import Sampling
from state import StoredResponse, StoreUnavailable
from state.conversations import ConversationFull

from ..assembler import ItemEvent, OutputAssembler, OutputItem, new_id
from ..conversations.api import conversation_items
from ..cot_recovery import index_cot
from ..dialog import Entry
from ..errors import ApiError, invalid, not_found, unavailable
from ..hosted.loop import Generation
from ..json_body import parse_model, read_json, read_model
from ..json_out import json_response
from ..limits import MAX_HISTORY_MESSAGES
from ..metrics import STATS
from ..pagination import page
from ..pipeline import Plan, count_prompt, plan_turn, start_turn
from ..services import SERVICES, Services
from ..sse import ClientGone, frame, open_stream, pump
from ..tenants.admission import Ticket
from ..tenants.tenancy import request_id_of, tenant_of
from ..turn import Outcome, Turn
from .event_sink import EventSink
from .hosted_tools import hosted_toolset, pending_approvals
from .input import check_tenant_caps, constraint_for, item_dicts, prompt_spec
from .models import REQUEST_TAGS, InputItem, McpTool, MessageInput, ResponsesRequest
from .output import StreamEvents, item_json
from .record_keeper import RecordKeeper
from .resume import stream_again
from .runs import EventLog, ListenerTooSlow, Run
from .tools import offered_tools

NOT_OFFERED_HEADER = "X-Gateway-Tools-Not-Offered"
STORED_ITEMS = TypeAdapter(list[InputItem])

log = structlog.get_logger("gateway.responses")

TERMINAL = ("completed", "incomplete", "failed", "cancelled")
CANCEL_POLL_S = 1.0


@dataclass(slots=True)
class Job:
    """One response being produced: the request, its prompt, and what the turn has made of it so far."""

    services: Services
    request: ResponsesRequest
    tenant: str
    response_id: str
    created_at: int
    dialog: list[Entry]
    input_items: list[dict[str, Any]]
    generation: Generation
    request_id: str
    ticket: Ticket
    keeper: RecordKeeper
    not_offered: list[str] = field(default_factory=list)  # hosted tool types left out of the prompt
    conversation_id: str | None = None
    sealed: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        headers = {"X-Request-ID": self.request_id}
        if self.not_offered:
            headers[NOT_OFFERED_HEADER] = ", ".join(dict.fromkeys(self.not_offered))
        return headers

    @property
    def first_status(self) -> str:
        return "queued" if self.request.background else "in_progress"

    def seal(self, item: OutputItem) -> str | None:
        if "reasoning.encrypted_content" not in self.request.include:
            return None
        if item.id not in self.sealed:
            self.sealed[item.id] = self.services.sealer.seal(self.tenant, item.text)
        return self.sealed[item.id]

    def response(self, status: str, outcome: Outcome | None = None) -> dict[str, Any]:
        req = self.request
        generation = self.generation
        assembler = generation.assembler
        finished = status in TERMINAL
        usage = None
        if finished:
            usage = {
                "input_tokens": generation.prompt_tokens,
                # cache writes are not reported by any backend here: 0 (the SDK requires the field)
                "input_tokens_details": {"cached_tokens": generation.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": assembler.output_tokens,
                "output_tokens_details": {"reasoning_tokens": assembler.reasoning_tokens},
                "total_tokens": generation.prompt_tokens + assembler.output_tokens,
            }
        error = None
        if outcome is not None and outcome.error_code:
            error = _response_error(outcome.error_code, outcome.error_message or "")
        incomplete = {"reason": outcome.incomplete_reason} if outcome and outcome.incomplete_reason else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "background": req.background,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "model": req.model,
            "output": [item_json(item, self.seal) for item in assembler.items] if finished else [],
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort or "medium", "summary": req.reasoning.summary},
            "service_tier": "default",
            "store": req.store and self.keeper.stored,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": req.text.model_dump(mode="json", by_alias=True, exclude_none=True),
            "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump(),
            "tools": [
                tool.echo() if isinstance(tool, McpTool) else tool.model_dump(mode="json", exclude_none=True)
                for tool in req.tools
            ],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation,
            "usage": usage,
            "user": req.user,
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "metadata": req.metadata or {},
            "conversation": {"id": self.conversation_id} if self.conversation_id else None,
        }

    def record(self, response: dict[str, Any]) -> StoredResponse:
        conversation = [entry.to_data() for entry in (*self.dialog, *self.generation.assembler.entries)]
        return StoredResponse(
            id=self.response_id,
            tenant=self.tenant,
            created_at=self.created_at,
            response=response,
            conversation=conversation[-MAX_HISTORY_MESSAGES:],
            input_items=self.input_items,
            client_metadata=self.request.client_metadata or {},
        )

    async def save_running(self, status: str) -> None:
        """Store the queued or in-progress response under a lease (when asked to store it at all)."""
        if self.request.store:
            await self.keeper.save_running(self.record(self.response(status)))

    async def store_final(self, response: dict[str, Any]) -> StoredResponse | None:
        """Save the final response; when the store is down and a running record waits for it, the record
        to keep retrying (the client hears `store: false` now; a background response's record, which
        nobody has seen, keeps `store: true`)."""
        if not self.request.store:
            return None
        record = self.record(response)
        if await self.keeper.save_final(record):
            response["store"] = self.keeper.stored
            if self.keeper.stored:
                await self._index_cot()
            return None
        pending = self.record({**response, "store": self.request.background})
        response["store"] = False
        return pending

    async def store_later(self, pending: StoredResponse | None) -> None:
        """Retry a final save that found the store down until it lands (see RecordKeeper)."""
        if pending is not None and await self.keeper.save_until_stored(pending):
            await self._index_cot()

    async def extend_conversation(self, status: str) -> None:
        """A finished (or cut-short) response adds its input and output items to its conversation."""
        if self.conversation_id is None or status not in ("completed", "incomplete"):
            return
        output = [item_json(item) for item in self.generation.assembler.items]
        try:
            kept = await self.services.conversations.append(
                self.tenant, self.conversation_id, [*self.input_items, *output]
            )
        except (StoreUnavailable, ConversationFull) as exc:
            log.warning("conversation_not_extended", response_id=self.response_id, error=type(exc).__name__)
            return
        if not kept:
            log.info("conversation_gone", response_id=self.response_id)

    async def _index_cot(self) -> None:
        if not self.keeper.deleted:
            assembler = self.generation.assembler
            await index_cot(self.services.store, self.tenant, assembler.items, assembler.entries, self.response_id)


# the codes a response's `error` may carry (the SDK's enum); the gateway's own (constraint_not_enforced,
# server_shutting_down) go as server_error with the specific code leading the message, as the stream's
# `error` event keeps it in its own `code`
RESPONSE_ERROR_CODES = frozenset(
    {"server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout", "invalid_image"}
)


def _response_error(code: str, message: str) -> dict[str, str]:
    if code in RESPONSE_ERROR_CODES:
        return {"code": code, "message": message}
    return {"code": "server_error", "message": f"{code}: {message}"}


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


async def _load_history(
    services: Services, tenant: str, request: ResponsesRequest
) -> tuple[list[Entry], list[dict[str, Any]]]:
    """The previous response's dialog and its output items (what its tools listed and where they ran)."""
    if request.previous_response_id is None:
        return [], []
    record = await _load(services, tenant, request.previous_response_id, "previous_response_id")
    status = record.response.get("status")
    if status not in TERMINAL:
        raise invalid("previous_response_id", f"Response '{record.id}' is still {status}; wait for it to finish.")
    output = record.response.get("output")
    return [Entry.from_data(data) for data in record.conversation], output if isinstance(output, list) else []


async def _load(services: Services, tenant: str, response_id: str, param: str) -> StoredResponse:
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
    history, previous_output = await _load_history(services, tenant, req)
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
            services, plan, sampling, constraint, request_id, observer, routing, req.prompt_cache_key, assembler
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


class Feed:
    """The stream events of one response: to its run's log (a streaming client) and, for a background
    response, to the shared event streams (streaming it again later); `Feed.off` when neither wants them."""

    def __init__(self, log: EventLog | None, events: StreamEvents | None, sink: EventSink | None = None) -> None:
        self._log = log
        self._events = events
        self._sink = sink

    @classmethod
    def off(cls) -> Feed:
        return cls(None, None)

    def _publish(self, payload: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.publish(payload)
        if self._sink is not None:
            self._sink.publish(payload)

    def lifecycle(self, kind: str, response: dict[str, Any]) -> None:
        if self._events is not None:
            self._publish(self._events.lifecycle(kind, response))

    def items(self, batch: list[ItemEvent]) -> None:
        if self._events is not None:
            for event in batch:
                for payload in self._events.for_item_event(event):
                    self._publish(payload)

    def error(self, code: str | None, message: str | None) -> None:
        if self._events is not None:
            self._publish(self._events.event("error", code=code, message=message, param=None))

    def cancelled(self) -> None:
        self.error("response_cancelled", "The response was cancelled.")

    def end(self) -> None:
        """The stream's last event is out: its listener may go (the run may still finish storing)."""
        if self._log is not None:
            self._log.close()


async def _tend(job: Job, task: asyncio.Task[None]) -> None:
    """While the run lasts: renew its record's lease, and stop it if another replica deleted or cancelled it."""
    keeper = job.keeper
    renew_every = keeper.lease_s / 3
    poll_s = min(CANCEL_POLL_S, renew_every) if job.request.background else renew_every
    next_renewal = time.monotonic() + renew_every
    while not task.done():
        await asyncio.sleep(poll_s)
        if time.monotonic() >= next_renewal:
            next_renewal = time.monotonic() + renew_every
            if not await keeper.renew():
                task.cancel()
                return
        if job.request.background and await keeper.cancelled_elsewhere():
            task.cancel()
            return


async def _run(job: Job, feed: Feed) -> dict[str, Any]:
    """Generate to the end (or cancellation), feeding the stream events; return the final object."""
    try:
        return await _generate(job, feed)
    finally:
        generation = job.generation
        await job.ticket.settle(generation.prompt_tokens + generation.assembler.output_tokens)


async def _generate(job: Job, feed: Feed) -> dict[str, Any]:
    if job.request.background:
        if await job.keeper.cancelled_elsewhere():  # cancelled while queued: keep the stored cancellation
            feed.cancelled()
            return job.response("cancelled")
        await job.save_running("in_progress")
        if job.keeper.deleted:  # deleted while queued: nothing to produce
            return job.response("cancelled")
    feed.lifecycle("response.created", job.response(job.first_status))
    feed.lifecycle("response.in_progress", job.response("in_progress"))
    try:
        async for batch in job.generation.events():
            feed.items(batch)
    except asyncio.CancelledError:
        await job.store_final(job.response("cancelled"))  # one attempt: a cancelled run does not linger
        feed.cancelled()
        raise
    outcome = job.generation.outcome or Outcome("failed", error_code="server_error", error_message="No outcome.")
    if job.request.background and await job.keeper.cancelled_elsewhere():
        outcome = Outcome("cancelled")
    final = job.response(outcome.status, outcome)
    pending = await job.store_final(final)
    await job.extend_conversation(outcome.status)
    if outcome.status == "cancelled":
        feed.cancelled()
    else:
        if outcome.status == "failed":
            feed.error(outcome.error_code, outcome.error_message)
        feed.lifecycle(f"response.{outcome.status}", final)
    feed.end()
    await job.store_later(pending)
    return final


def _start(job: Job, stream: bool) -> Run:
    run = Run(job.tenant)
    sink = EventSink(job.services.events, job.tenant, job.response_id) if job.request.background else None
    feed = Feed(run.log if stream else None, StreamEvents(job.seal), sink) if stream or sink else Feed.off()

    async def main() -> None:
        tender = None
        if job.keeper.leased:
            tender = asyncio.ensure_future(_tend(job, asyncio.current_task()))  # type: ignore[arg-type]
        try:
            await _run(job, feed)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("response_run_failed", response_id=job.response_id)
            failure = Outcome("failed", error_code="server_error", error_message="Internal error.")
            final = job.response("failed", failure)
            pending = await job.store_final(final)
            feed.lifecycle("response.failed", final)
            feed.end()
            await job.store_later(pending)
        finally:
            if tender is not None:
                tender.cancel()
            if sink is not None:
                await sink.close()
            run.log.close()
            job.services.runs.remove(job.response_id)

    lifecycle = job.services.lifecycle
    lifecycle.enter()  # counted from now (a drain cannot miss it) until the task is done, even if never started
    run.task = asyncio.ensure_future(main())
    run.task.add_done_callback(lambda _: lifecycle.leave())
    job.services.runs.add(job.response_id, run)
    return run


async def _frames(run: Run) -> AsyncIterator[bytes]:
    try:
        async for batch in run.log.follow():
            yield b"".join([frame(payload, payload["type"]) for payload in batch])
    except ListenerTooSlow:
        raise ClientGone from None


async def _stream(request: web.Request, job: Job) -> web.StreamResponse:
    run = _start(job, stream=True)
    response = await open_stream(request, job.headers)
    try:
        await pump(request, response, _frames(run))
    except ClientGone:
        run.log.detach()
        if not job.request.background and run.task is not None:
            run.task.cancel()  # nobody is listening: stop the generation
        return response
    await response.write_eof()
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
        _start(job, stream=False)
        return json_response(job.response("queued"), headers=job.headers)
    final = await _run(job, Feed.off())
    return json_response(final, headers=job.headers)


async def get_response(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    record = await _load(services, tenant_of(request), request.match_info["response_id"], "response_id")
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
    record = await _load(services, tenant, response_id, "response_id")
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
            record = await _load(services, tenant, response_id, "response_id")
            response = record.response
    elif status != "cancelled":
        raise invalid("response_id", f"Response '{response_id}' is already {status} and cannot be cancelled.")
    return json_response(response)


async def list_input_items(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    record = await _load(services, tenant_of(request), request.match_info["response_id"], "response_id")
    return json_response(page(record.input_items, request.query, f"response '{record.id}'"))


async def count_input_tokens(request: web.Request) -> web.Response:
    """The prompt a create with this body would render, counted by the same conversation builder (the
    model may be left out: every gpt-oss model has the same tokenizer)."""
    services = request.app[SERVICES]
    body = await read_json(request)
    if isinstance(body, dict) and body.get("model") is None:
        body = {**body, "model": next(iter(services.backends))}
    req = parse_model(body, ResponsesRequest, REQUEST_TAGS)
    services.backend_for(req.model)
    tenant = tenant_of(request)
    tools = offered_tools(req)
    check_tenant_caps(req, tools, services.settings.limits.for_tenant(tenant))
    history, previous_output = await _load_history(services, tenant, req)
    toolset, _ = await hosted_toolset(services.hosted, tenant, req, previous_output)
    spec = prompt_spec(req, tools, history, lambda blob: services.sealer.open(tenant, blob), toolset)
    count = await count_prompt(services, tenant, spec, request.content_length)
    return json_response({"object": "response.input_tokens", "input_tokens": count})


async def unknown_route(request: web.Request) -> web.Response:
    raise ApiError(404, f"Unknown route: {request.method} {request.path}.", code="not_found")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/responses/input_tokens", count_input_tokens)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.router.add_route("*", "/v1/responses/{tail:.*}", unknown_route)  # last: a 404, not a 405
