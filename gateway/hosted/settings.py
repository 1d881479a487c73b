"""The operator's settings for server-side tools (GATEWAY_HOSTED_TOOLS, JSON)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from .outbound import OutboundSettings
from .sandbox import SandboxSettings


class SearchSettings(BaseModel):
    """The search provider behind `web_search`: none configured, web search is not offered."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["searxng", "brave"] | None = None
    url: str | None = None  # SearXNG's base URL; Brave's API base (its public one when not set)
    api_key: SecretStr | None = None  # Brave's subscription token
    max_results: int = Field(default=10, ge=1, le=50)
    timeout_s: float = Field(default=10.0, gt=0, le=60)

    @model_validator(mode="after")
    def _complete(self) -> SearchSettings:
        if self.provider == "searxng" and not self.url:
            raise ValueError("the searxng provider needs its instance's url")
        if self.provider == "brave" and self.api_key is None:
            raise ValueError("the brave provider needs an api_key")
        return self


class McpAllowList(BaseModel):
    """URL prefixes of the MCP servers each tenant may use; none by default."""

    model_config = ConfigDict(extra="forbid")

    default: list[str] = Field(default_factory=list)
    tenants: dict[str, list[str]] = Field(default_factory=dict)

    def for_tenant(self, tenant: str) -> list[str]:
        return self.tenants.get(tenant, self.default)


class McpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allowed_urls: McpAllowList = Field(default_factory=McpAllowList)
    timeout_s: float = Field(default=30.0, gt=0, le=600)  # one listing or call, connection included
    max_output_chars: int = Field(default=100_000, ge=256)  # of a call's result, as the model and client see it
    list_ttl_s: float = Field(default=300.0, ge=0)  # a server's tool list is reused this long (per tenant)


class HostedToolsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    python: SandboxSettings = Field(default_factory=SandboxSettings)
    web_search: SearchSettings = Field(default_factory=SearchSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    outbound: OutboundSettings = Field(default_factory=OutboundSettings)
    max_calls: int = Field(default=16, ge=1, le=256)  # per response, when max_tool_calls does not say less
    max_seconds: float = Field(default=300.0, gt=0)  # all of one response's tool calls together
