"""What the routes share: settings, renderer, store, backends, the reasoning sealer and running responses."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from backends.base import Backend
from backends.registry import create_backend
from harmony import HarmonyEncoding, Renderer
from state import MemoryStore, ResponseStore
from state.keys import FileKeys, KeyAdminError, KeySource, RedisKeys
from state.limiter import RedisLimiter
from state.redis_store import RedisStore

from .admission import Admission
from .auth import Authenticator
from .config import Settings
from .errors import ApiError
from .lifecycle import Lifecycle
from .metrics import Metrics
from .runs import RunRegistry
from .sealing import ReasoningSealer, parse_keys
from .timed_store import TimedStore

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
    runs: RunRegistry = field(default_factory=RunRegistry)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)

    @property
    def encoding(self) -> HarmonyEncoding:
        return self.renderer.encoding

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
        await self.auth.aclose()
        await self.store.aclose()


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


def _store(settings: Settings) -> ResponseStore:
    if settings.redis_url:
        return RedisStore.from_url(
            settings.redis_url, ttl_s=settings.store_ttl_s, max_record_bytes=settings.max_record_bytes
        )
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


def build_services(settings: Settings, renderer: Renderer) -> Services:
    metrics = Metrics(settings.metrics_tenants)
    backends = _backends(settings, renderer.encoding)
    configs = settings.backend_configs()
    metrics.watch_engines({name: backends[c.models[0]] for name, c in configs.items() if c.models})
    return Services(
        settings=settings,
        renderer=renderer,
        store=TimedStore(_store(settings), metrics),
        backends=backends,
        sealer=_sealer(settings),
        auth=_authenticator(settings),
        admission=_admission(settings, metrics),
        metrics=metrics,
    )


SERVICES = web.AppKey("services", Services)
