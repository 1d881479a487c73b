"""What the routes share: settings, renderer, store, backends, the reasoning sealer and running responses."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from dataclasses import dataclass, field

import structlog
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from backends.base import Backend, Capabilities, SharesRoutes
from backends.registry import create_backend
from harmony import HarmonyEncoding, Renderer
from state import MemoryStore, ResponseStore, StoreUnavailable
from state.batches import BatchStore, MemoryBatches, RedisBatches
from state.conversations import ConversationStore, MemoryConversations, RedisConversations
from state.event_streams import EventStreams, MemoryEventStreams, RedisEventStreams
from state.files import FileStore, MemoryFiles, RedisFiles
from state.keys import FileKeys, KeyAdminError, KeySource, RedisKeys
from state.limiter import RedisLimiter
from state.record_cipher import RecordCipher
from state.redis_store import RedisStore
from state.route_book import RedisRouteBook
from state.usage_ledger import MemoryLedger, RedisLedger, UsageLedger

from .config import Settings
from .encrypted_reasoning import ReasoningSealer, parse_keys
from .errors import ApiError
from .hosted.runtime import HostedRuntime
from .hosted.settings import HostedToolsSettings
from .intake.checker_pool import CheckerPool
from .intake.costly_work import CostlyWork
from .intake.json_body import INTAKE
from .observability.metrics import Metrics
from .observability.timed_store import TimedStore
from .observability.tracing import configure_tracing
from .process.lifecycle import Lifecycle
from .process.task_stop import cancel_and_wait
from .responses.runs import RunRegistry
from .sse import STREAMING
from .tenants.admission import Admission
from .tenants.auth import Authenticator

log = structlog.get_logger("gateway.services")

DEFAULT_MOCK_SCRIPT = {
    "rules": [
        {
            "emit": [
                {"analysis": "No model backend is configured, so the scripted mock backend answers."},
                {"final": "This is gpt-oss-gateway's mock backend. Configure a model backend for real answers."},
            ]
        }
    ]
}


class ConfigError(ValueError):
    """The settings cannot make a working gateway; the message says which one."""


@dataclass(slots=True)
class Services:
    settings: Settings
    renderer: Renderer
    store: ResponseStore
    backends: dict[str, Backend]
    sealer: ReasoningSealer
    auth: Authenticator
    admission: Admission
    metrics: Metrics
    events: EventStreams = field(default_factory=MemoryEventStreams)
    conversations: ConversationStore = field(default_factory=MemoryConversations)
    runs: RunRegistry = field(default_factory=RunRegistry)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    hosted: HostedRuntime = field(default_factory=lambda: HostedRuntime(HostedToolsSettings()))
    costly: CostlyWork = field(default_factory=CostlyWork)
    ledger: UsageLedger = field(default_factory=MemoryLedger)
    ledger_retries: set[asyncio.Task[None]] = field(default_factory=set)  # usage records still being written
    tracing: TracerProvider | None = None  # set when the environment asks for traces (tracing.py)
    route_book: RedisRouteBook | None = None  # what every replica sent to which model server (with Redis)
    files: FileStore = field(default_factory=lambda: MemoryFiles(1 << 30, 1000))  # the Files API's (batch files)
    batches: BatchStore = field(default_factory=lambda: MemoryBatches(30 * 24 * 3600))
    # what each served model's backend can do (context length, logprobs): what a checker process is given
    capabilities: dict[str, Capabilities] = field(init=False)

    def __post_init__(self) -> None:
        self.capabilities = {model: backend.capabilities for model, backend in self.backends.items()}

    @property
    def encoding(self) -> HarmonyEncoding:
        return self.renderer.encoding

    def engine_weight(self, tenant: str) -> float:
        """The tenant's weight in an engine's fair share (GATEWAY_LIMITS `engine_weight`)."""
        return self.admission.config.for_tenant(tenant).engine_weight

    def backend_for(self, model: str) -> Backend:
        backend = self.backends.get(model)
        if backend is None:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this gateway serves {', '.join(self.backends)}.",
                param="model",
                code="model_not_found",
            )
        return backend

    async def aclose(self) -> None:
        await self.runs.shutdown()
        for backend in {id(b): b for b in self.backends.values()}.values():
            await backend.aclose()
        await self.admission.aclose()
        if self.route_book is not None:
            await self.route_book.aclose()
        await self.auth.aclose()
        await self.store.aclose()
        await self.events.aclose()
        await self.conversations.aclose()
        await self.files.aclose()
        await self.batches.aclose()
        await self.hosted.aclose()
        self.costly.close()
        await cancel_and_wait(list(self.ledger_retries), "usage record retries")
        await self.ledger.aclose()
        if self.tracing is not None:
            self.tracing.shutdown()  # the spans still queued go out (a bounded wait)


def _backends(settings: Settings, encoding: HarmonyEncoding) -> dict[str, Backend]:
    """Model id → backend instance, from the configuration; every model is served by exactly one backend."""
    by_model: dict[str, Backend] = {}
    for name, config in settings.backend_configs().items():
        options = config.options
        if config.kind == "mock" and not options:
            log.warning("mock_backend_default_script", backend=name, note="answers are canned text, not a model")
            options = copy.deepcopy(DEFAULT_MOCK_SCRIPT)
        try:
            backend = create_backend(config.kind, options, encoding)
        except ValueError as exc:  # UnknownBackend, or a factory refusing its options
            raise ConfigError(f"backends.{name}: {exc}") from exc
        for model in config.models:
            if model in by_model:
                raise ConfigError(f"backends.{name}: model '{model}' is already served by another backend")
            by_model[model] = backend
    return by_model


def _cipher(settings: Settings) -> RecordCipher | None:
    if not settings.store_encryption:
        return None
    if not settings.reasoning_keys:
        raise ConfigError("GATEWAY_STORE_ENCRYPTION needs GATEWAY_REASONING_KEYS (shared by every replica)")
    try:
        return RecordCipher(parse_keys(settings.reasoning_keys))
    except ValueError as exc:
        raise ConfigError(f"GATEWAY_REASONING_KEYS: {exc}") from exc


def _store(settings: Settings) -> ResponseStore:
    if settings.redis_url:
        cipher = _cipher(settings)
        try:
            return RedisStore.from_url(
                settings.redis_url,
                ttl_s=settings.store_ttl_s,
                max_record_bytes=settings.max_record_bytes,
                cipher=cipher,
            )
        except ValueError as exc:
            raise ConfigError(f"GATEWAY_REDIS_URL: {exc}") from None
    if settings.store_encryption:
        log.warning("store_encryption_ignored", note="the in-memory store never leaves this process")
    return MemoryStore(ttl_s=settings.store_ttl_s, max_record_bytes=settings.max_record_bytes)


def _sealer(settings: Settings) -> ReasoningSealer:
    if settings.reasoning_keys:
        try:
            return ReasoningSealer(parse_keys(settings.reasoning_keys))
        except ValueError as exc:
            raise ConfigError(f"GATEWAY_REASONING_KEYS: {exc}") from exc
    log.warning("reasoning_key_ephemeral", note="encrypted_content works only within this process")
    return ReasoningSealer.ephemeral()


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
MIN_KEY_SECRET_CHARS = 16


def _authenticator(settings: Settings) -> Authenticator:
    mode = settings.auth
    if mode == "auto":
        if settings.key_secret is not None or settings.keys_file:
            mode = "keys"
        elif settings.host in LOOPBACK_HOSTS:
            mode = "off"
        else:
            raise ConfigError(
                f"serving on {settings.host} without API keys: set GATEWAY_KEY_SECRET and GATEWAY_KEYS_FILE or "
                "GATEWAY_REDIS_URL (keys made with `gpt-oss-gateway keys create`), or GATEWAY_AUTH=off"
            )
    if mode == "off":
        log.warning("auth_off", note="every caller is the one tenant 'default'")
        return Authenticator.off()
    secret = settings.key_secret.get_secret_value() if settings.key_secret is not None else ""
    if len(secret) < MIN_KEY_SECRET_CHARS:
        raise ConfigError(f"GATEWAY_KEY_SECRET: API keys need a secret of {MIN_KEY_SECRET_CHARS}+ characters")
    sources: list[KeySource] = []
    if settings.keys_file:
        try:
            sources.append(FileKeys(settings.keys_file))
        except KeyAdminError as exc:
            raise ConfigError(f"GATEWAY_KEYS_FILE: {exc}") from exc
    if settings.redis_url:
        sources.append(RedisKeys.from_url(settings.redis_url))
    if not sources:
        raise ConfigError("GATEWAY_AUTH=keys needs GATEWAY_KEYS_FILE or GATEWAY_REDIS_URL to find keys in")
    return Authenticator(secret.encode(), sources)


def _admission(settings: Settings, metrics: Metrics) -> Admission:
    shared = RedisLimiter.from_url(settings.redis_url) if settings.redis_url else None

    def refused(tenant: str, limit: str) -> None:
        metrics.rate_limited.labels(limit, metrics.tenant_label(tenant)).inc()

    return Admission(settings.limits, shared, refused)


def _event_streams(settings: Settings) -> EventStreams:
    """Where background responses' events are kept for streaming them again: beside the store."""
    if settings.redis_url:
        return RedisEventStreams.from_url(settings.redis_url, ttl_s=settings.store_ttl_s, cipher=_cipher(settings))
    return MemoryEventStreams(ttl_s=settings.store_ttl_s)


def _conversations(settings: Settings) -> ConversationStore:
    if settings.redis_url:
        return RedisConversations.from_url(settings.redis_url, ttl_s=settings.store_ttl_s, cipher=_cipher(settings))
    return MemoryConversations(ttl_s=settings.store_ttl_s)


def _files(settings: Settings) -> FileStore:
    budget = {"tenant_bytes": settings.files_tenant_bytes, "tenant_files": settings.files_tenant_count}
    if settings.redis_url:
        return RedisFiles.from_url(settings.redis_url, cipher=_cipher(settings), **budget)
    return MemoryFiles(**budget)


def _batches(settings: Settings) -> BatchStore:
    if settings.redis_url:
        return RedisBatches.from_url(settings.redis_url, ttl_s=settings.store_ttl_s, cipher=_cipher(settings))
    return MemoryBatches(settings.store_ttl_s)


def usage_ledger(settings: Settings) -> UsageLedger:
    """The shared ledger in Redis when configured, else this process's."""
    retention_s = settings.usage_retention_days * 24 * 3600
    if settings.redis_url:
        return RedisLedger.from_url(settings.redis_url, retention_s=retention_s, cipher=_cipher(settings))
    return MemoryLedger(retention_s)


class QuietRouteBook:
    """The shared record of what was sent where, as backends use it: a Redis failure reads as nothing known."""

    def __init__(self, book: RedisRouteBook) -> None:
        self.book = book

    async def lookup(self, scope: str, names: list[bytes]) -> list[str | None]:
        try:
            return await self.book.lookup(scope, names)
        except StoreUnavailable:
            return [None] * len(names)

    async def note(self, scope: str, names: list[bytes], server: str, ttl_s: float) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.book.note(scope, names, server, ttl_s)


def _share_routes(settings: Settings, backends: dict[str, Backend]) -> RedisRouteBook | None:
    """With Redis, the remote backends that route by what was sent where share it across replicas."""
    sharing = [b for b in {id(b): b for b in backends.values()}.values() if isinstance(b, SharesRoutes)]
    if not settings.redis_url or not sharing:
        return None
    book = RedisRouteBook.from_url(settings.redis_url)
    for backend in sharing:
        backend.share_routes(QuietRouteBook(book))
    return book


def build_services(settings: Settings, renderer: Renderer) -> Services:
    metrics = Metrics(settings.metrics_tenants)
    store = TimedStore(_store(settings), metrics)  # every check that can refuse the settings runs before
    sealer = _sealer(settings)  # the backends start loading models
    auth = _authenticator(settings)
    admission = _admission(settings, metrics)
    backends = _backends(settings, renderer.encoding)
    route_book = _share_routes(settings, backends)
    metrics.start_at_zero(list(backends))
    configs = settings.backend_configs()
    metrics.watch_engines({name: backends[c.models[0]] for name, c in configs.items() if c.models})
    return Services(
        settings=settings,
        renderer=renderer,
        store=store,
        backends=backends,
        sealer=sealer,
        auth=auth,
        admission=admission,
        metrics=metrics,
        events=_event_streams(settings),
        route_book=route_book,
        conversations=_conversations(settings),
        files=_files(settings),
        batches=_batches(settings),
        hosted=HostedRuntime(settings.hosted_tools),
        ledger=usage_ledger(settings),
        tracing=configure_tracing(metrics.trace_spans_dropped.inc),
        costly=CostlyWork(checkers=_checkers(settings)),
    )


def _checkers(settings: Settings) -> CheckerPool | None:
    if not settings.request_checkers:
        return None
    return CheckerPool(settings.vocab_path, settings.max_body_bytes, preload=CHECK_MODULES)


CHECK_MODULES = ("gateway.chat.precheck", "gateway.responses.precheck")  # what the routes' checks are made of


async def report_store(services: Services) -> None:
    """At start: whether the store takes writes (and why not), and a Redis eviction policy that would
    silently drop stored responses, leases or tombstones."""
    inner = services.store.inner if isinstance(services.store, TimedStore) else services.store
    problem = await services.store.health()
    kind = "redis" if isinstance(inner, RedisStore) else "memory"
    if problem is not None:
        log.error("store_unavailable_at_start", store=kind, reason=problem)
        return
    policy = await inner.eviction_policy() if isinstance(inner, RedisStore) else None
    log.info("store_ready", store=kind, maxmemory_policy=policy)
    if policy is not None and policy != "noeviction":
        log.warning(
            "store_evicts",
            maxmemory_policy=policy,
            note="Redis may evict stored responses, leases and tombstones when full; use noeviction",
        )


SERVICES = web.AppKey("services", Services)


def attach(app: web.Application, services: Services) -> None:
    """The services in `app` under every key its handlers read them by (intake and streaming see only their
    part, so those modules import nothing above them)."""
    app[SERVICES] = services
    app[INTAKE] = services
    app[STREAMING] = services
