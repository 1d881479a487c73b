"""Gateway settings from the environment (GATEWAY_*) and the command line."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from state.store import DEFAULT_LEASE_S, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S

from .hosted.settings import HostedToolsSettings
from .limits import MAX_BODY_BYTES
from .process.event_loop import EventLoopSetting
from .tenants.limits import LimitsConfig


class BackendConfig(BaseModel):
    """One backend instance: its kind (an installed entry point), its options and the models it serves."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: str
    """The backend's kind: an installed entry point (`onnx`, `engine`, `vllm`, `sglang`, `sglang_generate`, `llamacpp`,
    `mock`)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The kind's options (its own reference below)."""
    models: list[str] = Field(min_length=1)
    """The model names this backend serves."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """The address the API listens on (0.0.0.0 in the container images)."""
    port: int = 8000
    """The API's port."""
    vocab_path: str | None = None
    """A local o200k_base.tiktoken; see harmony.vocab for the search order."""
    models: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["gpt-oss-120b", "gpt-oss-20b"])
    """The model names served when `backends` is not given (comma-separated)."""
    backend: str = "onnx"
    """The kind serving `models` when `backends` is not given: the built-in engine (with no checkpoint configured, a
    random demo model that warns its output is noise)."""
    mock_script: str | None = None
    """A mock backend script (JSON); set alone, it selects the mock backend."""
    backend_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Remote `backend`: upstream URLs."""
    backend_options: dict[str, Any] = Field(default_factory=dict)
    """JSON: more options for `backend`."""
    backends: dict[str, BackendConfig] | None = None
    """JSON: several backends, `{"name": {"kind", "options", "models"}, ...}` (the kinds' options below)."""
    redis_url: str | None = None
    """A Redis URL for the shared store (None: the bounded in-memory store)."""
    store_ttl_s: int = Field(default=DEFAULT_TTL_S, gt=0)
    """How long stored responses, conversations and chains of thought are kept, in seconds."""
    usage_retention_days: int = Field(default=90, gt=0)
    """Days the usage ledger keeps each tenant's records."""
    admin_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Tenants whose keys may read any tenant's usage records and engine queues (comma-separated)."""
    max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, gt=0)
    """The largest stored record (a response with its input and output), in bytes."""
    record_lease_s: float = Field(default=DEFAULT_LEASE_S, ge=0.3, le=3600)
    """A running response's lease: renewed by its replica every third of it; past it, readers see it failed."""
    reasoning_keys: str | None = None
    """`id:base64(32 bytes),...` for encrypted_content; None: per-process key."""
    store_encryption: bool = False
    """Redis records (raw CoT included) encrypted at rest with keys from reasoning_keys."""
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    """The largest request body, in bytes (a tenant's `max_body_bytes` may lower it)."""
    request_checkers: bool = True
    """Large bodies parsed and checked in idle-priority processes first (checker_pool.py); off: in paced threads."""
    keepalive_s: float = Field(default=15.0, gt=0)
    """Seconds between SSE keep-alive comments on a quiet stream."""
    event_loop: EventLoopSetting = "auto"
    """The event loop: uvloop where installed (auto), or asyncio's own; `uvloop`: an error where it is missing."""
    drain_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: how long work in flight may finish before it is cut."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A request's head must arrive within this (slowloris)."""
    idle_timeout_s: float = Field(default=75.0, gt=0)
    """A kept-alive connection with no request is closed after this."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """A request's body must arrive within this."""
    reasoning_stream_events: Literal["reasoning_text", "reasoning"] = "reasoning_text"
    """The reasoning stream events' names: OpenAI's `response.reasoning_text.delta/.done` (what the openai SDK and
    Agents SDK read), or the Open Responses spec's `response.reasoning.delta/.done`."""
    ws_idle_s: float = Field(default=600.0, gt=0)
    """A WebSocket with no message and nothing running is closed."""
    ws_max_sockets: int = Field(default=16, ge=1)
    """Open WebSockets per tenant, per replica."""
    ws_max_age_s: float = Field(default=3600.0, gt=0)
    """A WebSocket's lifetime (OpenAI's: 60 minutes)."""
    write_stall_s: float = Field(default=30.0, gt=0)
    """A stream whose client reads nothing this long is cut."""
    auth: Literal["auto", "off", "keys"] = "auto"
    """`auto`: API keys when a key secret or keys file is set; none on a loopback address; else refuse to start."""
    key_secret: SecretStr | None = None
    """The HMAC secret API keys are hashed with (16+ characters)."""
    keys_file: str | None = None
    """A JSON file of hashed keys (`gpt-oss-gateway keys create --file`)."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """JSON: per-tenant rate, concurrency and size limits."""
    hosted_tools: HostedToolsSettings = Field(default_factory=HostedToolsSettings)
    """JSON: the tools the gateway runs for the model (python sandbox, web search provider, MCP allow-lists)."""
    metrics_port: int | None = None
    """A separate listener for /metrics (Prometheus); None: not served there."""
    metrics_public: bool = False
    """Also serve /metrics on the API port (off: the API port does not expose it)."""
    metrics_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Tenants with their own `tenant` label in the metrics (comma-separated)."""
    files_max_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    """The largest uploaded file, in bytes (OpenAI's batch input limit)."""
    files_tenant_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """The bytes a tenant's files may hold together."""
    files_tenant_count: int = Field(default=1000, gt=0)
    """Files a tenant may keep at once."""
    batch_max_lines: int = Field(default=50_000, gt=0)
    """Requests in one batch input file (OpenAI's limit)."""
    batch_lines_in_flight: int = Field(default=4, gt=0)
    """A running batch's lines in flight at once, per replica."""
    batch_running_per_replica: int = Field(default=2, gt=0)
    """Batches one replica runs at once."""
    batch_poll_s: float = Field(default=2.0, gt=0)
    """How often a replica looks for batches nobody runs."""
    batch_lease_s: float = Field(default=30.0, ge=1)
    """A batch's lease, in seconds: its runner renews it; past it, another replica takes the batch."""

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

    model_config = SettingsConfigDict(env_prefix="GATEWAY_ENGINE_", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """The address the engine server listens on."""
    port: int = 8100
    """The engine server's port."""
    vocab_path: str | None = None
    """A local o200k_base.tiktoken, as for the gateway (constraints compile with it)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """JSON: the engine's options, as the `onnx` backend's."""
    api_key: SecretStr | None = None
    """Asked of clients as a Bearer token (the API replicas' backend `api_key`)."""
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """The largest generation request (prompt ids and schemas), in bytes."""
    event_loop: EventLoopSetting = "auto"
    """The event loop: uvloop where installed (`auto`), `asyncio`, or `uvloop`."""
    drain_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: how long generations in flight may finish."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A request's head must arrive within this (slowloris)."""
    idle_timeout_s: float = Field(default=75.0, gt=0)
    """A kept-alive connection with no request is closed after this."""


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
