"""Gateway settings from the environment (GATEWAY_*) and the command line."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from state.store import DEFAULT_LEASE_S, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S

from .event_loop import EventLoopSetting
from .hosted.settings import HostedToolsSettings
from .limits import MAX_BODY_BYTES
from .tenants.limits import LimitsConfig


class BackendConfig(BaseModel):
    """One backend instance: its kind (an installed entry point), its options and the models it serves."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    options: dict[str, Any] = Field(default_factory=dict)
    models: list[str] = Field(min_length=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_")

    host: str = "127.0.0.1"
    port: int = 8000
    vocab_path: str | None = None  # a local o200k_base.tiktoken; see harmony.vocab for the search order
    models: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["gpt-oss-120b", "gpt-oss-20b"])
    # the kind serving `models` when `backends` is not given: the built-in engine (with no checkpoint
    # configured, a random demo model that warns its output is noise)
    backend: str = "onnx"
    mock_script: str | None = None  # a mock backend script (JSON); set alone, it selects the mock backend
    backend_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)  # remote `backend`: upstream URLs
    backend_options: dict[str, Any] = Field(default_factory=dict)  # JSON: more options for `backend`
    backends: dict[str, BackendConfig] | None = None  # JSON: {"name": {"kind", "options", "models"}, ...}
    redis_url: str | None = None  # None: the bounded in-memory store
    store_ttl_s: int = Field(default=DEFAULT_TTL_S, gt=0)
    usage_retention_days: int = Field(default=90, gt=0)  # the usage ledger's records, per tenant
    admin_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)  # their keys may export any usage
    max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, gt=0)
    # a running response's lease: renewed by its replica every third of it; past it, readers see it failed
    record_lease_s: float = Field(default=DEFAULT_LEASE_S, ge=0.3, le=3600)
    reasoning_keys: str | None = None  # `id:base64(32 bytes),...` for encrypted_content; None: per-process key
    store_encryption: bool = False  # Redis records (raw CoT included) encrypted at rest with keys from reasoning_keys
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    # large bodies parsed and checked in idle-priority processes first (checker_pool.py); off: in paced threads
    request_checkers: bool = True
    keepalive_s: float = Field(default=15.0, gt=0)
    # the event loop: uvloop where installed (auto), or asyncio's own; `uvloop`: an error where it is missing
    event_loop: EventLoopSetting = "auto"
    drain_s: float = Field(default=30.0, ge=0)  # on SIGTERM: how long work in flight may finish before it is cut
    header_timeout_s: float = Field(default=10.0, gt=0)  # a request's head must arrive within this (slowloris)
    idle_timeout_s: float = Field(default=75.0, gt=0)  # a kept-alive connection with no request is closed after
    body_timeout_s: float = Field(default=60.0, gt=0)  # a request's body must arrive within this
    # the reasoning stream events' names: OpenAI's `response.reasoning_text.delta/.done` (what the openai SDK
    # and Agents SDK read), or the Open Responses spec's `response.reasoning.delta/.done`
    reasoning_stream_events: Literal["reasoning_text", "reasoning"] = "reasoning_text"
    ws_idle_s: float = Field(default=600.0, gt=0)  # a WebSocket with no message and nothing running is closed
    ws_max_sockets: int = Field(default=16, ge=1)  # open WebSockets per tenant, per replica
    ws_max_age_s: float = Field(default=3600.0, gt=0)  # a WebSocket's lifetime (OpenAI's: 60 minutes)
    write_stall_s: float = Field(default=30.0, gt=0)  # a stream whose client reads nothing this long is cut
    # auto: API keys when a key secret or keys file is set; none on a loopback address; else refuse to start
    auth: Literal["auto", "off", "keys"] = "auto"
    key_secret: SecretStr | None = None  # the HMAC secret API keys are hashed with (16+ characters)
    keys_file: str | None = None  # a JSON file of hashed keys (`gpt-oss-gateway keys create --file`)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # JSON: per-tenant rate, concurrency and size limits
    # JSON: the tools the gateway runs for the model (python sandbox, web search provider, MCP allow-lists)
    hosted_tools: HostedToolsSettings = Field(default_factory=HostedToolsSettings)
    metrics_port: int | None = None  # a separate listener for /metrics (Prometheus); None: not served there
    metrics_public: bool = False  # also serve /metrics on the API port (off: the API port does not expose it)
    metrics_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)  # tenants with their own label
    # the Files and Batch APIs: one uploaded file's bytes (OpenAI's batch input limit), a tenant's files together
    files_max_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    files_tenant_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    files_tenant_count: int = Field(default=1000, gt=0)  # files a tenant may keep at once
    batch_max_lines: int = Field(default=50_000, gt=0)  # requests in one batch input file (OpenAI's limit)
    batch_lines_in_flight: int = Field(default=4, gt=0)  # a running batch's lines in flight at once, per replica
    batch_running_per_replica: int = Field(default=2, gt=0)  # batches one replica runs at once
    batch_poll_s: float = Field(default=2.0, gt=0)  # how often a replica looks for batches nobody runs
    batch_lease_s: float = Field(default=30.0, ge=1)  # a batch's runner renews it; past it, another replica takes it

    @field_validator("models", "backend_urls", "metrics_tenants", "admin_tenants", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    def backend_configs(self) -> dict[str, BackendConfig]:
        """The configured backends; without `backends`, one of kind `backend` serving `models`."""
        if self.backends:
            return self.backends
        options = dict(self.backend_options)
        kind = self.backend
        if self.mock_script and "backend" not in self.model_fields_set:
            kind = "mock"  # a mock script alone means the mock, as the README's CI recipe runs it
        if kind == "mock" and self.mock_script:
            options["script"] = self.mock_script
        if self.backend_urls:
            options["urls"] = self.backend_urls
        return {"default": BackendConfig(kind=kind, options=options, models=self.models)}


class EngineServerSettings(BaseSettings):
    """`gpt-oss-gateway serve-engine`: the built-in engine alone, for API replicas' `engine` backends."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_ENGINE_")

    host: str = "127.0.0.1"
    port: int = 8100
    vocab_path: str | None = None  # a local o200k_base.tiktoken, as for the gateway (constraints compile with it)
    options: dict[str, Any] = Field(default_factory=dict)  # JSON: the engine's options, as the `onnx` backend's
    api_key: SecretStr | None = None  # asked of clients as a Bearer token (the API replicas' backend `api_key`)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)  # a generation request: prompt ids and schemas
    event_loop: EventLoopSetting = "auto"
    drain_s: float = Field(default=30.0, ge=0)  # on SIGTERM: how long generations in flight may finish
    header_timeout_s: float = Field(default=10.0, gt=0)
    idle_timeout_s: float = Field(default=75.0, gt=0)


def _variable(field: str, prefix: str = "GATEWAY_") -> str:
    return f"{prefix}{field.upper()}"


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and `overrides`, or a ValueError that names the variable at fault."""
    return _load(Settings, "GATEWAY_", overrides)


def load_engine_server_settings(**overrides: Any) -> EngineServerSettings:
    return _load(EngineServerSettings, "GATEWAY_ENGINE_", overrides)


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def _load(kind: type[SettingsT], prefix: str, overrides: dict[str, Any]) -> SettingsT:
    try:
        return kind(**overrides)
    except SettingsError as exc:  # a JSON-valued variable that is not JSON
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        raise ValueError(f"{_variable(field, prefix)} is not valid JSON") from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            field, _, inner = where.partition(".")
            name = _variable(field, prefix) + (f" ({inner})" if inner else "")
            problems.append(f"{name}: {error['msg']} (got {str(error.get('input'))[:80]!r})")
        raise ValueError("; ".join(problems)) from None
