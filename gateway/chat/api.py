"""The Chat Completions route: a thin skin over the shared builder, turns and assembler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial
from typing import Any

from aiohttp import web

from backends.base import Sampling

from ..errors import ApiError
from ..generation.constraints import NOT_ENFORCED
from ..generation.cot_recovery import index_cot
from ..generation.plan import off_the_loop_if_large, plan_turn, start_turn
from ..ids import new_id
from ..intake.json_body import body_bytes, read_model
from ..json_out import json_response
from ..limits import MAX_STREAM_BACKLOG
from ..observability.metrics import STATS
from ..process.lifecycle import SHUTTING_DOWN
from ..services import SERVICES, Services
from ..sse import DONE, ClientGone, end_stream, frame, open_stream, pump
from ..tenants.service_tiers import applied_tier
from ..tenants.tenancy import key_id_of, request_id_of, tenant_of
from ..usage.billing import bill, chat_record
from .input import checked_constraint, prompt_spec
from .models import CHAT_UNION_TAGS, ChatRequest
from .output import Choice, usage
from .precheck import check_chat, check_options
from .stop_sequences import StopMatcher


def _backend_failure(choice: Choice) -> ApiError:
    outcome = choice.turn.outcome
    message = outcome.error_message if outcome and outcome.error_message else "The model backend failed."
    if outcome is not None and outcome.error_code == SHUTTING_DOWN:
        return ApiError(503, message, code=SHUTTING_DOWN, kind="server_error")
    return ApiError(502, message, code="backend_error", kind="server_error")


async def _drain(choice: Choice, on_delta: Any = None) -> None:
    """Run one choice to its end (or its stop sequence), passing each delta to `on_delta`."""
    async with aclosing(choice.turn.events()) as batches:
        async for batch in batches:
            for event in batch:
                for delta, logprobs in choice.deltas(event):
                    if on_delta is not None:
                        await on_delta(choice, delta, logprobs)
            if choice.stops.stopped:
                return  # closing the iterator stops the generation


class Completion:
    """The request's choices and the envelope every body and chunk shares."""

    def __init__(
        self,
        services: Services,
        req: ChatRequest,
        tenant: str,
        choices: list[Choice],
        key_id: str | None = None,
        tier: str = "default",
    ) -> None:
        """`tier`: the service tier applied (echoed and billed)."""
        self.services = services
        self.tier = tier
        self.req = req
        self.tenant = tenant
        self.key_id = key_id
        self.choices = choices
        self.id = new_id("chatcmpl-")
        self.created = int(time.time())
        self.billed = False

    async def bill(self, status: str) -> None:
        """Put the completion's usage on the ledger (once), before the client hears the end."""
        if self.billed:
            return
        self.billed = True
        calls = sum(len(choice.tool_calls) for choice in self.choices)
        entry = chat_record(
            self.tenant, self.key_id, self.id, self.req.model, status, usage(self.choices), calls, self.created,
            self.tier,
        )  # fmt: skip
        await bill(self.services, entry)

    def envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.req.model,
            "service_tier": self.tier,
            "system_fingerprint": None,
        }

    async def finish(self, choice: Choice) -> None:
        await index_cot(self.services.store, self.tenant, choice.turn.assembler.items, choice.turn.assembler.entries)

    def violation(self) -> dict[str, Any] | None:
        for choice in self.choices:
            outcome = choice.turn.outcome
            if outcome is not None and outcome.error_code == NOT_ENFORCED:
                return {"code": NOT_ENFORCED, "message": f"choice {choice.index}: {outcome.error_message}"}
        return None


def _failed(choice: Choice) -> bool:
    outcome = choice.turn.outcome
    return outcome is not None and outcome.status == "failed" and outcome.error_code != NOT_ENFORCED


async def _respond(completion: Completion) -> web.Response:
    async def run(choice: Choice) -> None:
        await _drain(choice)
        await completion.finish(choice)

    await asyncio.gather(*(run(choice) for choice in completion.choices))
    failed = next((choice for choice in completion.choices if _failed(choice)), None)
    if failed is not None:
        await completion.bill("failed")
        raise _backend_failure(failed)
    await completion.bill("completed")
    body = completion.envelope("chat.completion")
    body["choices"] = [
        {
            "index": c.index,
            "message": c.message(),
            "logprobs": {"content": c.logprobs, "refusal": None} if completion.req.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        for c in completion.choices
    ]
    body["usage"] = usage(completion.choices)
    violation = completion.violation()
    if violation is not None:
        body["error"] = violation  # the output stands, and the client is told the rule was not enforced
    return json_response(body)


async def _chunks(completion: Completion) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[bytes | Choice] = asyncio.Queue(MAX_STREAM_BACKLOG)  # full: the producers wait
    include_usage = bool(completion.req.stream_options and completion.req.stream_options.include_usage)

    def chunk(
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> bytes:
        body = completion.envelope("chat.completion.chunk")
        scored = {"content": logprobs, "refusal": None} if logprobs is not None else None
        body["choices"] = [{"index": index, "delta": delta, "logprobs": scored, "finish_reason": finish_reason}]
        if include_usage:
            body["usage"] = None
        return frame(body)

    async def on_delta(choice: Choice, delta: dict[str, Any], logprobs: list[dict[str, Any]] | None) -> None:
        await queue.put(chunk(choice.index, delta, logprobs=logprobs))

    async def produce(choice: Choice) -> None:
        try:
            await queue.put(chunk(choice.index, {"role": "assistant", "content": ""}))
            await _drain(choice, on_delta)
            await completion.finish(choice)
        finally:
            if closing:  # nobody reads the queue any more: waiting for room in it would never end
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(choice)
            else:
                await queue.put(choice)

    closing = False
    producers = [asyncio.ensure_future(produce(choice)) for choice in completion.choices]
    try:
        open_choices = len(producers)
        while open_choices:
            item = await queue.get()
            if isinstance(item, Choice):
                open_choices -= 1
                if _failed(item):
                    await completion.bill("failed")
                    yield frame({"error": _backend_failure(item).body()["error"]})
                    return
                yield chunk(item.index, {}, item.finish_reason)
            else:
                yield item
        await completion.bill("completed")
        if include_usage:
            tail = completion.envelope("chat.completion.chunk")
            yield frame({**tail, "choices": [], "usage": usage(completion.choices)})
        violation = completion.violation()
        if violation is not None:
            yield frame({"error": {**violation, "type": "invalid_request_error", "param": None}})
        yield DONE
    finally:
        closing = True
        for producer in producers:
            producer.cancel()
        await asyncio.gather(*producers, return_exceptions=True)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    limits = services.settings.limits.for_tenant(tenant)
    check = partial(check_chat, limits=limits, capabilities=services.capabilities)
    req = await read_model(request, tenant, ChatRequest, CHAT_UNION_TAGS, check)
    backend = services.backend_for(req.model)
    check_options(req, backend.capabilities)
    asked = req.max_completion_tokens or req.max_tokens
    constraint = await off_the_loop_if_large(
        services, tenant, body_bytes(request), lambda: checked_constraint(req, limits)
    )
    max_output = asked or limits.max_output_tokens
    plan = await plan_turn(services, tenant, backend, prompt_spec(req), max_output, body_bytes(request))
    ticket = await services.admission.admit(
        tenant,
        prompt_tokens=len(plan.built.tokens),
        max_output_tokens=plan.max_new_tokens,
        choices=req.n,
        stream=req.stream,
    )
    request_id = request_id_of(request, new_id("req_"))
    tier = applied_tier(req.service_tier, limits, backend, request)
    choices = []
    for index in range(req.n):
        sampling = Sampling(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=None if req.seed is None else req.seed + index,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
        )
        observer = services.metrics.turn_observer(req.model, tenant, request.get(STATS))
        request_key = f"{request_id}/{index}"
        turn = start_turn(
            services,
            tenant,
            plan,
            sampling,
            constraint,
            request_key,
            observer,
            cache_key=req.prompt_cache_key,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            tier=tier,
        )
        choices.append(Choice(index, turn, StopMatcher(req.stop_sequences)))
    completion = Completion(services, req, tenant, choices, key_id_of(request), tier)
    try:
        if not req.stream:
            return await _respond(completion)
        response = await open_stream(request, {"X-Request-ID": request_id})
        try:
            await pump(request, response, _chunks(completion))
        except ClientGone:
            return response
        await end_stream(request, response)
        return response
    finally:
        await completion.bill("cancelled")  # the client went, or the request failed: what ran is billed
        await ticket.settle(len(plan.built.tokens) + sum(c.turn.assembler.output_tokens for c in choices))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", create_chat_completion)
