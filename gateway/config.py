"""Gateway settings from the environment (GATEWAY_*) and the command line."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_")

    host: str = "127.0.0.1"
    port: int = 8000
    vocab_path: str | None = None  # a local o200k_base.tiktoken; see harmony.vocab for the search order
