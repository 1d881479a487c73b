"""A backend that streams tokens from remote token servers over HTTP, in one of several dialects.

Connections are pooled (one aiohttp session per backend). A generation goes to the upstream with the
fewest requests in flight; a failure (unreachable, 5xx, 429, silence, stream cut) moves it to another upstream,
up to `retries` times: before its first token, the same request; after it, the answer continues there from the
tokens already given (the prompt followed by them, `GenerateRequest.continues`), so a server that dies mid-answer
loses no stream. The gateway's Turn enforces the stop ids and the token limit on every backend: once either is
reached it reads no more tokens, and closing the generation closes the upstream connection, which
every supported server treats as an abort.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .base import BackendError, Capabilities, Chunk, GenerateRequest, RoutingReport, SharedRoutes, parse_options
from .cache_salt import TenantSalt
from .routing import kv_events, load_metrics, vllm_events
from .routing.router import PrefixRouter, RoutingSettings, Warm
from .routing.shared_record import SharedRecord
from .sse_reader import EventTooLarge, sse_events
from .upstreams import Upstream, UpstreamPool
from .wire import Dialect, UpstreamProtocolError, UpstreamReported, error_text

log = structlog.get_logger("backends.remote")

MAX_ERROR_BODY_BYTES = 64 * 1024


class RemoteOptions(BaseModel):
    """A remote backend's options (the `options` object of its entry in GATEWAY_BACKENDS)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    urls: list[str] = Field(min_length=1)
    """Base URLs of the upstream servers, e.g. http://vllm-0:8000."""
    model: str | None = None
    """The model name the server expects (OpenAI-compatible servers)."""
    api_key: SecretStr | None = None
    """The upstream's API key, sent as a Bearer token."""
    api_key_env: str | None = None
    """The name of an environment variable that holds the API key instead (e.g. from a Secret)."""
    context_length: int = Field(default=131_072, gt=0)
    """The server's context (vLLM --max-model-len)."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Seconds to connect to an upstream."""
    first_token_timeout_s: float = Field(default=300.0, gt=0)
    """Seconds to the first token, queueing and prefill included."""
    token_timeout_s: float = Field(default=60.0, gt=0)
    """The longest silence between tokens."""
    retries: int = Field(default=2, ge=0)
    """Further upstreams tried when an attempt fails: before its first token, the request again; after it, the
    answer continued from the tokens given."""
    max_connections: int = Field(default=256, gt=0)
    """Connections kept to the upstreams together."""
    eject_after: int = Field(default=3, gt=0)
    """Consecutive failures that eject an upstream."""
    probe_interval_s: float = Field(default=5.0, gt=0)
    """How often an ejected upstream is probed."""
    health_path: str = "/health"
    """The path probed for an upstream's health."""
    max_event_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """The largest SSE event an upstream may send, in bytes."""
    cache_salt: bool | None = None
    """The tenant's `cache_salt` on every request (None: on for vllm, off for sglang; other kinds have none)."""
    cache_salt_secret_env: str = "GATEWAY_KEY_SECRET"
    """The environment variable holding the secret the salts are made with, shared by every replica."""
    prefix_routing: bool = True
    """Prefix-aware routing (backends/routing/router.py): off, the fewest requests in flight wins."""
    priority_scheduling: bool = False
    """vLLM: send the service tier as `priority` (the servers run with --scheduling-policy priority)."""
    load_slack: float = Field(default=2, ge=0)
    """A server this much more loaded than the least gets no request."""
    server_slots: int | None = Field(default=None, ge=1)
    """Requests each server runs at once (vLLM's --max-num-seqs, llama.cpp's --parallel): a server with this many
    gets none while another has room (None: a server is full when it says requests wait; the built-in engine's
    servers say their own)."""
    routing_page_tokens: int = Field(default=32, ge=1, le=4096)
    """The page size, in tokens, of the index of what was routed where."""
    routing_ttl_s: float = Field(default=600.0, gt=0)
    """A routed page unused this long counts as evicted."""
    routing_capacity_pages: int = Field(default=65_536, ge=1)
    """Routed pages remembered per server."""
    routing_min_match: float = Field(default=0.3, ge=0, le=1)
    """A server holding less than this share of a prompt is routed to as if it held none (SGLang: cache_threshold)."""
    prefix_warming_min_tokens: int = Field(default=512, ge=0)
    """A prefix that requests of different sessions share (a tenant's long system prompt), this long or longer, is
    sent ahead (one token asked, at the flex tier) to a lighter server that does not hold it while the server
    holding it is busier, so later requests spread without paying its prefill (0: never)."""
    prefix_warming_window_s: float = Field(default=60.0, gt=0)
    """Sessions matching one prefix this close together make it hot; a server is warmed with it once a window."""
    load_metrics_interval_s: float = Field(default=1.0, ge=0)
    """How often servers' /metrics are read (0: never)."""
    kv_events_endpoints: list[str] | None = None
    """vLLM: each server's KV-cache events (its --kv-events-config ZMQ PUB endpoint, e.g. tcp://vllm-0:5557), one
    a URL."""

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
                raise ValueError(f"'{url}' is not an http(s) base URL")
        if len(set(urls)) != len(urls):
            raise ValueError("the same URL is listed twice")
        return urls

    @model_validator(mode="after")
    def _events_endpoint_per_url(self) -> RemoteOptions:
        endpoints = self.kv_events_endpoints
        if endpoints is not None:
            if len(endpoints) != len(self.urls):
                raise ValueError("kv_events_endpoints lists one endpoint for each of urls, in their order")
            for endpoint in endpoints:
                parts = urlsplit(endpoint)
                if parts.scheme != "tcp" or not parts.hostname or not parts.port:
                    raise ValueError(f"'{endpoint}' is not a tcp://host:port endpoint")
        return self

    @model_validator(mode="after")
    def _key_from_the_environment(self) -> RemoteOptions:
        if self.api_key_env is not None and self.api_key is None:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ValueError(f"api_key_env names {self.api_key_env}, which is not set")
            self.api_key = SecretStr(value)
        return self


class _Failure(Exception):
    """One attempt failed; `message` is for API clients, `reason` for logs."""

    def __init__(self, message: str, reason: str, *, retryable: bool, upstream_fault: bool) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.retryable = retryable
        self.upstream_fault = upstream_fault


def _http_failure(status: int, body: bytes) -> _Failure:
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body.decode("utf-8", "replace")
    if isinstance(parsed, dict):
        parsed = parsed.get("error") or parsed.get("message") or parsed.get("detail") or "no details"
    detail = error_text(parsed)
    if status >= 500:
        return _Failure(
            f"The model server failed (HTTP {status}).", f"http_{status}", retryable=True, upstream_fault=True
        )
    if status == 429:
        return _Failure("The model server is overloaded (HTTP 429).", "http_429", retryable=True, upstream_fault=False)
    message = f"The model server rejected the request (HTTP {status}): {detail}"
    return _Failure(message, f"http_{status}", retryable=False, upstream_fault=False)


CUT = _Failure(
    "The model server closed the stream before the generation finished.",
    "stream_cut",
    retryable=True,
    upstream_fault=True,
)


class RemoteBackend:
    def __init__(self, dialect: Dialect, options: RemoteOptions, salt: TenantSalt | None = None) -> None:
        """`salt`: the tenants' `cache_salt` the dialect sends (vLLM), in whose namespace its KV events name pages."""
        if options.kv_events_endpoints is not None and salt is None:
            raise ValueError(
                f"{dialect.name} backend: options.kv_events_endpoints: only vllm reads KV events (with its cache_salt)"
            )
        self.dialect = dialect
        self.options = options
        self.capabilities = Capabilities(
            context_length=options.context_length,
            constraints=dialect.constraints,
            logprobs=dialect.logprobs,
            prefix_cache=dialect.prefix_cache,
            service_tiers=dialect.service_tiers,
        )
        self.pool = UpstreamPool(options.urls, options.eject_after, options.probe_interval_s, self._probe)
        self.router: PrefixRouter | None = None
        if options.prefix_routing:
            settings = RoutingSettings(
                options.routing_page_tokens,
                options.load_slack,
                options.routing_ttl_s,
                options.routing_capacity_pages,
                options.routing_min_match,
                options.server_slots,
                options.prefix_warming_min_tokens,
                options.prefix_warming_window_s,
            )
            published = dialect.publishes_pages or options.kv_events_endpoints is not None
            self.router = PrefixRouter([u.url for u in self.pool.upstreams], settings, published, salt)
        self._watchers: list[asyncio.Task[None]] = []
        self._warmups: set[asyncio.Task[None]] = set()
        self.shared: SharedRecord | None = None  # what every replica sent where (Redis), when shared
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_options(cls, dialect: Dialect, options: dict[str, Any]) -> RemoteBackend:
        return cls(dialect, parse_options(RemoteOptions, options, dialect.name))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Content-Type": "application/json"}
            if self.options.api_key is not None:
                headers["Authorization"] = f"Bearer {self.options.api_key.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.options.max_connections, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.options.connect_timeout_s),
                headers=headers,
            )
        return self._session

    async def _probe(self, url: str) -> bool:
        try:
            async with asyncio.timeout(self.options.connect_timeout_s * 2):
                async with self._client().get(url + self.options.health_path) as response:
                    return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def ready(self) -> bool:
        """Ready while some upstream is not ejected (ejected ones are probed back in the background)."""
        self._watch()
        return any(upstream.healthy for upstream in self.pool.upstreams)

    def _watch(self) -> None:
        """Start following each server's page events and load, once, on the running loop."""
        if self._watchers or self.router is None:
            return
        session = self._client()
        endpoints = dict(zip(self.router.servers, self.options.kv_events_endpoints or [], strict=False))
        for url, view in self.router.servers.items():
            if view.published is not None and url in endpoints:
                self._watchers.append(asyncio.ensure_future(vllm_events.follow(endpoints[url], view.published)))
            elif view.published is not None:
                self._watchers.append(asyncio.ensure_future(kv_events.follow(session, url, view)))
            if self.options.load_metrics_interval_s:
                interval = self.options.load_metrics_interval_s
                self._watchers.append(asyncio.ensure_future(load_metrics.poll(session, url, view, interval)))

    def share_routes(self, routes: SharedRoutes) -> None:
        """Route by what every replica sent where (servers that publish nothing), through `routes`."""
        if self.router is not None and self.router.shares:
            self.shared = SharedRecord(routes, self.options.routing_ttl_s)

    def routing_stats(self) -> RoutingReport | None:
        """How generations were routed and what the router knows of each server (None: routing is off)."""
        if self.router is None:
            return None
        return self.router.report({u.url: u.outstanding for u in self.pool.upstreams})

    async def aclose(self) -> None:
        for task in (*self._watchers, *self._warmups):
            task.cancel()
        await asyncio.gather(*self._watchers, *self._warmups, return_exceptions=True)
        await self.pool.aclose()
        if self._session is not None:
            await self._session.close()

    def _body(self, request: GenerateRequest) -> bytes:
        return json.dumps(self.dialect.body(request, self.options.model), separators=(",", ":")).encode()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        sent, body = request, self._body(request)  # what the next attempt sends
        answered: list[int] = []  # tokens given by earlier attempts, which the next one continues
        tried: list[Upstream] = []
        router, record = self.router, self.shared
        pages = shared = None
        if router is not None:
            self._watch()
            pages = router.pages(request)
            if record is not None:
                scope, names = router.shared_scope(request), router.shared_names(pages.routed())
                shared = await record.holdings(scope, names)
        for attempt in range(self.options.retries + 1):
            chooser = None if router is None else router.chooser(request, shared, pages)
            upstream = self.pool.pick(tried, request.cache_key, chooser)
            tried.append(upstream)
            generated: list[int] = []
            sending = None if chooser is None else chooser.sending(upstream)  # its prompt, queued there till it answers
            warm = None if chooser is None or chooser.decision is None else chooser.decision.warm
            if warm is not None:
                self._send_ahead(request, warm)
            try:
                async with aclosing(self._attempt(upstream, sent, body)) as chunks:
                    async for chunk in chunks:
                        if chunk.tokens and sending is not None and not generated:  # its prompt is held there now
                            sending.answering()
                            if record is not None:
                                record.note(scope, names, upstream.url)
                        generated += chunk.tokens
                        yield chunk
            except _Failure as failure:
                answered += generated
                left = request.max_new_tokens - len(answered)
                if failure.upstream_fault:
                    self.pool.failed(upstream, failure.reason)
                    if router is not None and not upstream.healthy:
                        router.forget(upstream.url)
                last = not failure.retryable or attempt == self.options.retries or left <= 0
                log.warning(
                    "upstream_failed",
                    backend=self.dialect.name,
                    upstream=upstream.url,
                    reason=failure.reason,
                    request_id=request.request_id,
                    attempt=attempt,
                    retrying=not last,
                    continuing=len(answered),
                )
                if last:
                    raise BackendError(failure.message) from None
                if generated:
                    sent = replace(
                        request,
                        prompt=request.prompt + answered,
                        max_new_tokens=left,
                        continues=(*request.continues, *answered),
                    )
                    body = self._body(sent)
                continue
            finally:
                if sending is not None:
                    sending.done()
            self.pool.succeeded(upstream)
            if router is not None and pages is not None:
                answer = router.record(upstream.url, request, answered + generated, pages)
                if record is not None:
                    record.note(scope, router.shared_names(names + answer)[len(names) :], upstream.url)
            return

    def _send_ahead(self, request: GenerateRequest, warm: Warm) -> None:
        """Send the request's first `warm.tokens` prompt tokens to `warm.url` in the background (warming.py)."""
        ahead = GenerateRequest(
            request.prompt[: warm.tokens],
            1,
            (),
            f"{request.request_id}.warm",
            cache_key=request.cache_key,
            tenant=request.tenant,
            weight=request.weight,
            tier="flex",
        )
        task = asyncio.create_task(self._warm(ahead, warm))
        self._warmups.add(task)
        task.add_done_callback(self._warmups.discard)

    async def _warm(self, request: GenerateRequest, warm: Warm) -> None:
        """One attempt at `url`, its output dropped; once it answers, the server holds the prefix (noted as a
        generation's prompt is)."""
        router, record, url = self.router, self.shared, warm.url
        assert router is not None
        upstream = next((u for u in self.pool.upstreams if u.url == url), None)
        try:
            if upstream is None or not upstream.healthy:
                return
            pages = router.pages(request)
            sending = router.sending(url, len(request.prompt), pages)
            try:
                async with aclosing(self._attempt(upstream, request, self._body(request))) as chunks:
                    async for chunk in chunks:
                        if chunk.tokens:
                            sending.answering()
                            if record is not None:
                                names = router.shared_names(pages.routed())
                                record.note(router.shared_scope(request), names, url)
                            break
            finally:
                sending.done()
        except _Failure as failure:
            if failure.upstream_fault:
                self.pool.failed(upstream, failure.reason)
            log.info("prefix_warming_failed", backend=self.dialect.name, upstream=url, reason=failure.reason)
        finally:
            router.warming.done(warm.prefix, url)

    async def _attempt(self, upstream: Upstream, request: GenerateRequest, body: bytes) -> AsyncIterator[Chunk]:
        options = self.options
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.first_token_timeout_s
        headers = {**request.trace_context, "X-Request-ID": f"{request.request_id}.{secrets.token_hex(4)}"}
        with self.pool.lease(upstream):
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self._client().post(upstream.url + self.dialect.path, data=body, headers=headers)
            except TimeoutError:
                raise self._silence(first=True) from None
            except aiohttp.ClientError:
                raise _Failure(
                    "The model server could not be reached.", "unreachable", retryable=True, upstream_fault=True
                ) from None
            clean = False
            try:
                if response.status != 200:
                    try:
                        async with asyncio.timeout(options.token_timeout_s):
                            body = await response.content.read(MAX_ERROR_BODY_BYTES)
                    except TimeoutError:
                        body = b""  # the status alone says enough
                    raise _http_failure(response.status, body)
                events = sse_events(response.content.iter_any(), options.max_event_bytes)
                async for chunk in self._chunks(events, request, deadline):
                    yield chunk
                clean = True
            except (aiohttp.ClientError, ConnectionError):
                raise CUT from None
            except EventTooLarge as exc:
                raise _Failure(
                    f"The model server's stream is malformed: {exc}.",
                    "event_too_large",
                    retryable=False,
                    upstream_fault=False,
                ) from None
            finally:
                if clean:
                    response.release()  # the connection goes back to the pool when the body was read to its end
                else:
                    response.close()  # an abort: the server sees the connection close

    async def _chunks(
        self, events: AsyncIterator[Any], request: GenerateRequest, deadline: float
    ) -> AsyncIterator[Chunk]:
        """Chunks from the upstream's events, within the timeouts (the Turn enforces stop ids and the limit)."""
        loop = asyncio.get_running_loop()
        stops = set(request.stop_ids)
        received = 0
        last_token: int | None = None
        ended = False  # the server finished, or sent a stop token
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    event = await anext(events, None)
            except TimeoutError:
                if ended:
                    return  # the output is whole; only the usage report is missing
                raise self._silence(first=received == 0) from None
            if event is None:
                if ended:
                    return
                raise CUT
            if event.field == "error":
                raise self._reported(error_text(_json_or_text(event.value)))
            if event.value.strip() == "[DONE]":
                if ended:
                    return
                raise CUT
            try:
                payload = json.loads(event.value)
                if not isinstance(payload, dict):
                    raise UpstreamProtocolError("an event is not a JSON object")
                step = self.dialect.step(payload, received)
            except UpstreamReported as exc:
                raise self._reported(str(exc)) from None
            except (ValueError, UpstreamProtocolError) as exc:
                raise _Failure(
                    f"The model server's stream is malformed: {exc}.", "protocol", retryable=False, upstream_fault=False
                ) from None
            tokens = step.tokens
            logprobs = step.logprobs
            received += len(tokens)
            if tokens:
                last_token = tokens[-1]
                deadline = loop.time() + self.options.token_timeout_s
            if step.finished and step.stop_token in stops and last_token != step.stop_token:
                tokens = [*tokens, step.stop_token]  # the server matched a stop token without sending it
                logprobs = None if logprobs is None else [*logprobs, None]
                last_token = step.stop_token
            if tokens or step.cached_tokens is not None:
                yield Chunk(tokens, cached_tokens=step.cached_tokens, logprobs=logprobs)
            ended = ended or step.finished or last_token in stops
            if ended:
                deadline = loop.time() + self.options.token_timeout_s  # only the usage report may follow

    def _silence(self, first: bool) -> _Failure:
        if first:
            seconds = self.options.first_token_timeout_s
            return _Failure(
                f"The model server sent no token within {seconds:g} s.",
                "first_token_timeout",
                retryable=True,
                upstream_fault=True,
            )
        seconds = self.options.token_timeout_s
        return _Failure(
            f"The model server sent nothing for {seconds:g} s.", "token_timeout", retryable=True, upstream_fault=True
        )

    @staticmethod
    def _reported(text: str) -> _Failure:
        return _Failure(
            f"The model server reported an error: {text}", "reported", retryable=False, upstream_fault=False
        )


def _json_or_text(value: str) -> Any:
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
