"""The Responses API's WebSocket mode (`client.responses.connect()`): `GET /v1/responses` upgraded.

Client events: `response.create`, the create body (`stream` implicit, `background` refused) with an optional
`stream_id` lane; `generate: false` makes the response (its input held for a continuation) without
sampling. Creates on one lane run one after another, in order; lanes run side by side. Server events are the
SSE stream's events, as JSON text messages, each with the `stream_id` of its create when it had one;
a create that fails is an `error` event (`status` and the HTTP error's body) and the socket stays usable, as it
does after a malformed event; a response that fails mid-stream sends its `error` event in the same shape (the
SDK's `ResponseWsError`). Each response the socket made is held for it (the last HELD_RESPONSES, stored or
not), so `previous_response_id` continues with only the new input, even with `store: false`; a continuation
that fails (refused, or ending `failed`) evicts the response it named, and a failed response is not held, so
naming either later is `previous_response_not_found`, which clients answer by sending the whole context.

The upgrade passes through the same middleware as any request (key, tenant, drain, metrics); each create
through the same admission, limits and store as `POST /v1/responses`. Bounded: a message's size
(GATEWAY_MAX_BODY_BYTES), the lanes of a socket (MAX_LANES), the creates waiting in a lane (LANE_BACKLOG), the
sockets of a tenant on one replica (GATEWAY_WS_MAX_SOCKETS), time without a message or a running response
(GATEWAY_WS_IDLE_S), a socket's lifetime (GATEWAY_WS_MAX_AGE_S), a client that reads nothing
(GATEWAY_WRITE_STALL_S). When the replica drains, or the socket reaches its age, it finishes its running
responses, answers the creates still waiting with an error event (`server_shutting_down`,
`websocket_connection_limit_reached`), and closes (1001 going away, 1000), so the client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from aiohttp import WSMsgType, web

from state import StoredResponse

from ..errors import ApiError, invalid
from ..intake.body_decoding import parse_json
from ..intake.json_body import OFFLOAD_BYTES
from ..process.lifecycle import SHUTTING_DOWN
from ..services import SERVICES
from ..tenants.tenancy import tenant_of
from .execution import start_job
from .job import Job
from .prepare import prepare
from .runs import ListenerTooSlow
from .stream_events import StreamEvents

log = structlog.get_logger("gateway.responses.websocket")

HELD_RESPONSES = 16  # per socket: each holds its whole conversation
LANE_BACKLOG = 16
MAX_LANES = 32  # named lanes per socket, as OpenAI's WebSocket mode allows
LANE_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
GOING_AWAY = 1001
TERMINAL_EVENTS = ("response.completed", "response.failed", "response.incomplete", "response.cancelled")


class SocketGone(Exception):
    """The client closed the socket, or stopped reading it."""


class Sockets:
    """The open sockets of this replica, counted per tenant."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, int] = {}

    def open(self, tenant: str, cap: int) -> bool:
        count = self._by_tenant.get(tenant, 0)
        if count >= cap:
            return False
        self._by_tenant[tenant] = count + 1
        return True

    def close(self, tenant: str) -> None:
        self._by_tenant[tenant] -= 1
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant]


SOCKETS = web.AppKey("response_sockets", Sockets)


@dataclass(slots=True)
class _Lane:
    queue: asyncio.Queue[tuple[dict[str, Any], int, bool]] = field(default_factory=lambda: asyncio.Queue(LANE_BACKLOG))
    task: asyncio.Task[None] | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # nothing running on it, nothing waiting
    running: bool = False  # a create is being answered

    @property
    def busy(self) -> bool:
        return not self.idle.is_set()


class _Session:
    def __init__(self, request: web.Request, socket: web.WebSocketResponse) -> None:
        self.request = request
        self.socket = socket
        self.settings = request.app[SERVICES].settings
        self.lanes: dict[str, _Lane] = {}
        self.held: OrderedDict[str, StoredResponse] = OrderedDict()
        self._sending = asyncio.Lock()
        self.closing = False
        self.closes_at = time.monotonic() + self.settings.ws_max_age_s

    @property
    def busy(self) -> bool:
        return any(lane.busy or not lane.queue.empty() for lane in self.lanes.values())

    async def serve(self) -> None:
        lifecycle = self.request.app[SERVICES].lifecycle
        drained = asyncio.ensure_future(lifecycle.drain_started.wait())
        try:
            while not self.closing:
                received = asyncio.ensure_future(self.socket.receive())
                timeout = min(self.settings.ws_idle_s, max(self.closes_at - time.monotonic(), 0.0))
                done, _ = await asyncio.wait({received, drained}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if received not in done:
                    received.cancel()
                    if drained in done:
                        await self._leave(GOING_AWAY, _shutting_down())
                        return
                    if time.monotonic() >= self.closes_at:
                        await self._leave(1000, self._aged())
                        return
                    if not self.busy:
                        await self._leave(1000, None)
                        return
                    continue
                message = received.result()
                if message.type == WSMsgType.TEXT:
                    await self._on_text(message.data)
                elif message.type == WSMsgType.BINARY:
                    await self._error(invalid(None, "Send client events as JSON text messages."), None)
                else:  # closed by the client, or an error (a message over the size limit closes with 1009)
                    return
        except SocketGone:
            return
        finally:
            drained.cancel()
            for lane in self.lanes.values():
                if lane.task is not None:
                    lane.task.cancel()
            tasks = [lane.task for lane in self.lanes.values() if lane.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _leave(self, code: int, why: ApiError | None) -> None:
        """Finish what runs, answer the creates still waiting with `why`, then close (an idle socket: no `why`)."""
        self.closing = True
        for lane_id, lane in self.lanes.items():
            while not lane.queue.empty():
                lane.queue.get_nowait()
                if why is not None:
                    await self._error(why, lane_id or None)
            if not lane.running:  # its task may still wait on the queue it was woken for
                lane.idle.set()
        await asyncio.gather(*(lane.idle.wait() for lane in self.lanes.values()))
        reason = why.code if why is not None and why.code else "idle"
        await self.socket.close(code=code, message=reason.encode())

    def _aged(self) -> ApiError:
        minutes = self.settings.ws_max_age_s / 60
        message = (
            f"Responses websocket connection limit reached ({minutes:g} minutes). "
            "Create a new websocket connection to continue."
        )
        return invalid(None, message, "websocket_connection_limit_reached")

    async def _on_text(self, text: str) -> None:
        try:
            if len(text) < OFFLOAD_BYTES:
                event = orjson.loads(text)
            else:  # the tenant's costly work, off the loop (a message may be GATEWAY_MAX_BODY_BYTES)
                costly = self.request.app[SERVICES].costly
                event = await costly.run(tenant_of(self.request), lambda: parse_json(text.encode()))
        except orjson.JSONDecodeError:
            await self._error(invalid(None, "The message is not valid JSON.", "invalid_json"), None)
            return
        except ApiError as exc:
            await self._error(exc, None)
            return
        if not isinstance(event, dict):
            await self._error(invalid(None, "A client event must be a JSON object.", "invalid_type"), None)
            return
        kind = event.get("type")
        lane_id = event.get("stream_id")
        if lane_id is not None and (not isinstance(lane_id, str) or not LANE_ID.fullmatch(lane_id)):
            message = "stream_id must be 1 to 256 characters of letters, digits, '_', '.' and '-'."
            await self._error(invalid("stream_id", message, "invalid_stream_id"), None)
            return
        if kind == "response.steer":
            message = "response.steer is not supported by this gateway; send a response.create."
            await self._error(invalid("type", message, "unsupported_parameter"), lane_id)
            return
        if kind != "response.create":
            await self._error(invalid("type", f"Unknown client event type: {kind!r}.", "unknown_event"), lane_id)
            return
        body = {key: value for key, value in event.items() if key not in ("type", "stream_id", "stream")}
        if body.get("background"):
            message = "background responses are not supported over a WebSocket; use POST /v1/responses."
            await self._error(invalid("background", message, "unsupported_parameter"), lane_id)
            return
        generate = body.pop("generate", True)
        if not isinstance(generate, bool):
            await self._error(invalid("generate", "generate must be a boolean."), lane_id)
            return
        if time.monotonic() >= self.closes_at:
            await self._error(self._aged(), lane_id)
            return
        lane = self.lanes.get(lane_id or "")
        if lane is None:
            if sum(1 for name in self.lanes if name) >= MAX_LANES and lane_id:
                message = f"This socket already has {MAX_LANES} lanes (stream_id values); reuse one."
                await self._error(invalid("stream_id", message, "websocket_stream_limit_reached"), lane_id)
                return
            lane = self.lanes[lane_id or ""] = _Lane()
            lane.task = asyncio.ensure_future(self._run_lane(lane, lane_id))
        try:
            lane.queue.put_nowait((body, len(text), generate))
            lane.idle.clear()  # busy from now: an idle check or a drain waits for this create
        except asyncio.QueueFull:
            message = f"{LANE_BACKLOG} creates already wait on this lane; wait for one to finish."
            await self._error(ApiError(429, message, code="lane_full", kind="rate_limit_error"), lane_id)

    async def _run_lane(self, lane: _Lane, lane_id: str | None) -> None:
        while True:
            lane.idle.set()
            body, size, generate = await lane.queue.get()
            lane.idle.clear()
            lane.running = True
            try:
                await self._create(body, size, lane_id, generate)
            except SocketGone:
                lane.idle.set()
                return
            finally:
                lane.running = False

    async def _create(self, body: dict[str, Any], size: int, lane_id: str | None, generate: bool) -> None:
        previous = body.get("previous_response_id")
        try:
            job = await prepare(self.request, body, size, self.held)
            if not generate:
                await self._prepare_only(job, lane_id)
                return
            await job.save_running(job.first_status)
        except ApiError as exc:
            self._count("refused")
            self._evict(previous)
            await self._error(exc, lane_id)
            return
        run = start_job(job, stream=True)
        final: dict[str, Any] | None = None
        try:
            async for batch in run.log.follow():
                for payload in batch:
                    if payload["type"] in TERMINAL_EVENTS:
                        final = payload["response"]
                    elif payload["type"] == "error":
                        payload = _socket_error(payload)
                    await self._send({**payload, "stream_id": lane_id} if lane_id else payload)
        except ListenerTooSlow:
            await self.socket.close(code=1008, message=b"the client fell too far behind the stream")
        finally:
            if run.task is not None and not run.task.done():
                run.task.cancel()  # the socket went: stop the generation
                await asyncio.wait({run.task}, timeout=5)
        self._count(final.get("status", "failed") if final is not None else "cancelled")
        if final is not None and final.get("status") == "failed":
            self._evict(previous)
        elif final is not None:
            self._hold(job, final)
            usage = final.get("usage") or {}
            log.info(
                "websocket_response",
                response_id=job.response_id,
                status=final.get("status"),
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
            )

    async def _prepare_only(self, job: Job, lane_id: str | None) -> None:
        """`generate: false`: the response is made (its input kept, for a later `previous_response_id`) and
        completes with no output. On a backend with a prefix cache (the built-in engine), its prompt is
        prefilled meanwhile (one token sampled and dropped), so the continuation starts from that KV."""
        turn = job.generation.turn
        spent = 0
        try:
            final = job.response("completed")
            await job.store_final(final)
            if turn.backend.capabilities.prefix_cache:
                spent = await turn.prewarm()
        finally:
            await job.ticket.settle(turn.prompt_tokens + spent if spent else 0)
        events = StreamEvents(job.seal, obfuscate=False)
        for payload in (
            events.lifecycle("response.created", job.response(job.first_status)),
            events.lifecycle("response.completed", final),
        ):
            await self._send({**payload, "stream_id": lane_id} if lane_id else payload)
        self._hold(job, final)
        self._count("prepared")

    def _hold(self, job: Job, final: dict[str, Any]) -> None:
        """Keep the response for this socket's continuations: the last HELD_RESPONSES of them."""
        self.held[job.response_id] = job.record(final)
        while len(self.held) > HELD_RESPONSES:
            self.held.popitem(last=False)

    def _evict(self, response_id: object) -> None:
        """A failed continuation's previous response is no longer the socket's to continue from."""
        if isinstance(response_id, str):
            self.held.pop(response_id, None)

    def _count(self, status: str) -> None:
        metrics = self.request.app[SERVICES].metrics
        tenant = metrics.tenant_label(tenant_of(self.request))
        metrics.child(metrics.websocket_responses, status, tenant).inc()

    async def _error(self, error: ApiError, lane_id: str | None) -> None:
        payload: dict[str, Any] = {"type": "error", "status": error.status, **error.body()}
        if lane_id:
            payload["stream_id"] = lane_id
        await self._send(payload)

    async def _send(self, payload: dict[str, Any]) -> None:
        """One message; a client that reads nothing for GATEWAY_WRITE_STALL_S loses the socket."""
        if self.socket.closed:
            raise SocketGone
        async with self._sending:
            try:
                async with asyncio.timeout(self.settings.write_stall_s):
                    await self.socket.send_str(orjson.dumps(payload).decode())
            except (TimeoutError, ConnectionError) as exc:
                with contextlib.suppress(Exception):
                    await self.socket.close(code=1008, message=b"the client stopped reading")
                raise SocketGone from exc


def _shutting_down() -> ApiError:
    return ApiError(503, "The gateway is shutting down; reconnect.", code=SHUTTING_DOWN, kind="server_error")


def _socket_error(payload: dict[str, Any]) -> dict[str, Any]:
    """A stream's `error` event (the SSE shape: code and message at the top) as the socket's error event."""
    error = {"type": "server_error", "code": payload.get("code"), "message": payload.get("message") or ""}
    return {"type": "error", "sequence_number": payload.get("sequence_number"), "error": {**error, "param": None}}


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """`GET /v1/responses`: a WebSocket for `response.create` events (anything else is a 400)."""
    socket = web.WebSocketResponse(max_msg_size=request.app[SERVICES].settings.max_body_bytes, heartbeat=30.0)
    if not socket.can_prepare(request).ok:
        raise ApiError(
            400,
            "GET /v1/responses opens a WebSocket (responses.connect()); create a response with POST /v1/responses.",
            code="websocket_required",
        )
    settings = request.app[SERVICES].settings
    tenant = tenant_of(request)
    sockets = request.app[SOCKETS]
    if not sockets.open(tenant, settings.ws_max_sockets):
        message = f"This key's tenant already has {settings.ws_max_sockets} WebSockets open on this replica."
        raise ApiError(429, message, code="too_many_websockets", kind="rate_limit_error")
    metrics = request.app[SERVICES].metrics
    metrics.websockets.inc()
    try:
        await socket.prepare(request)
        await _Session(request, socket).serve()
    finally:
        sockets.close(tenant)
        metrics.websockets.dec()
    return socket
