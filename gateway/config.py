"""Gateway settings from the environment (GATEWAY_*) and the command line."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from state.store import DEFAULT_MAX_RECORD_BYTES, DEFAULT_TTL_S

from .limits import MAX_BODY_BYTES
from .tenant_limits import LimitsConfig


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
    max_record_bytes: int = Field(default=DEFAULT_MAX_RECORD_BYTES, gt=0)
    reasoning_keys: str | None = None  # `id:base64(32 bytes),...` for encrypted_content; None: per-process key
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    keepalive_s: float = Field(default=15.0, gt=0)
    drain_s: float = Field(default=30.0, ge=0)  # on SIGTERM: how long work in flight may finish before it is cut
    # auto: API keys when a key secret or keys file is set; none on a loopback address; else refuse to start
    auth: Literal["auto", "off", "keys"] = "auto"
    key_secret: SecretStr | None = None  # the HMAC secret API keys are hashed with (16+ characters)
    keys_file: str | None = None  # a JSON file of hashed keys (`gpt-oss-gateway keys create --file`)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # JSON: per-tenant rate, concurrency and size limits
    metrics_port: int | None = None  # a separate listener for /metrics (Prometheus); None: not served there
    metrics_public: bool = False  # also serve /metrics on the API port (off: the API port does not expose it)
    metrics_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)  # tenants with their own label

    @field_validator("models", "backend_urls", "metrics_tenants", mode="before")
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
