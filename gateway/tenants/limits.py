"""Per-tenant limits: defaults for every tenant and overrides by tenant name (GATEWAY_LIMITS, JSON)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from backends.base import SchedulingTier

from ..errors import invalid

DEFAULT_CONCURRENT_BACKGROUND = 64


class TenantLimits(BaseModel):
    """Null means no limit of that kind; the static caps of gateway/limits.py always apply."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    requests_per_minute: int | None = Field(default=None, gt=0)
    """Requests a minute (GCRA; a minute's worth may come at once)."""
    tokens_per_minute: int | None = Field(default=None, gt=0)
    """Tokens a minute: prompt + max output reserved, settled at the end."""
    concurrent_requests: int | None = Field(default=None, gt=0)
    """Generations in flight at once, background included."""
    concurrent_streams: int | None = Field(default=None, gt=0)
    """Streamed generations in flight."""
    concurrent_background: int | None = Field(default=DEFAULT_CONCURRENT_BACKGROUND, gt=0)
    """Background responses queued or running: capped by default (each holds a generation nobody waits on)."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """The most output tokens a request may ask for."""
    max_body_bytes: int | None = Field(default=None, gt=0)
    """The largest request body, in bytes."""
    max_input_items: int | None = Field(default=None, gt=0)
    """The most input items (Responses) or messages (Chat Completions) a request may carry."""
    max_tools: int | None = Field(default=None, ge=0)
    """The most tools a request may declare."""
    max_schema_bytes: int | None = Field(default=None, gt=0)
    """The largest JSON schema given for output or a tool, in bytes."""
    engine_weight: float = Field(default=1.0, gt=0, le=1000)
    """The tenant's weight in the built-in engine's fair share of its batch and steps (tokens count 1/weight)."""
    service_tiers: tuple[SchedulingTier, ...] = ("default", "flex")
    """The service tiers the tenant may ask for; any other runs at `auto_service_tier` (also `auto` and no tier)."""
    auto_service_tier: SchedulingTier = "default"
    """The tier a request runs at when it asks `auto`, nothing, or a tier not in `service_tiers`."""


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: TenantLimits = Field(default_factory=TenantLimits)
    tenants: dict[str, TenantLimits] = Field(default_factory=dict)
    # when Redis cannot be reached: "local" counts in this process alone, "open" admits, "closed" refuses (503)
    on_store_failure: Literal["local", "open", "closed"] = "local"
    lease_ttl_s: float = Field(default=120.0, gt=1)  # a concurrency slot of a dead replica frees after this

    _merged: dict[str, TenantLimits] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        """Each override merged with the defaults once, not on every request."""
        self._merged = {
            tenant: self.default.model_copy(update=override.model_dump(exclude_unset=True))
            for tenant, override in self.tenants.items()
        }
        for tenant, limits in [("default", self.default), *self._merged.items()]:
            if limits.auto_service_tier not in limits.service_tiers:
                raise ValueError(
                    f"GATEWAY_LIMITS: tenant {tenant!r}'s auto_service_tier {limits.auto_service_tier!r} "
                    f"is not among its service_tiers {list(limits.service_tiers)}"
                )

    def for_tenant(self, tenant: str) -> TenantLimits:
        if not self.tenants:  # no overrides: skip pydantic's private-attribute lookup (several per request)
            return self.default
        return self._merged.get(tenant, self.default)


def check_caps(
    limits: TenantLimits,
    *,
    output: tuple[str, int | None],
    items: tuple[str, int],
    tools: tuple[str, int],
    schemas: list[tuple[str, int]],
) -> None:
    """A 400 naming the parameter that goes over one of the tenant's size caps."""
    param, value = output
    if limits.max_output_tokens is not None and value is not None and value > limits.max_output_tokens:
        raise invalid(param, f"{param} is {value}; this API key allows at most {limits.max_output_tokens}.")
    param, count = items
    if limits.max_input_items is not None and count > limits.max_input_items:
        raise invalid(param, f"{param} has {count} items; this API key allows at most {limits.max_input_items}.")
    param, count = tools
    if limits.max_tools is not None and count > limits.max_tools:
        raise invalid(param, f"{param} has {count} tools; this API key allows at most {limits.max_tools}.")
    for param, size in schemas:
        if limits.max_schema_bytes is not None and size > limits.max_schema_bytes:
            raise invalid(param, f"The schema is {size} bytes; this API key allows at most {limits.max_schema_bytes}.")


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))
