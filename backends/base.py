"""The Backend protocol: prompt token ids in, an async stream of generated token ids out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

OptionsT = TypeVar("OptionsT", bound=BaseModel)
# the service tiers a backend schedules by, best first (the API's other names map onto these)
SchedulingTier = Literal["priority", "default", "flex"]
TIER_RANK: dict[str, int] = {"priority": 0, "default": 1, "flex": 2}


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # OpenAI's penalties, on the text tokens generated so far: a token's logit less presence_penalty once it
    # has appeared and frequency_penalty for each time it has (Harmony's special tokens are never penalised)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output must match; backends whose capabilities say `constraints` enforce it while sampling.

    `tools`: "any" (free choice), "none" (no tool call), "required" (end in a call to one of `tool_names`).
    `final_json_schema`: the final channel must be JSON valid against this schema ({} = any JSON value).
    `tool_parameters`: each offered function's parameters schema (None: any JSON object), for its arguments.
    `tool_grammars`: each offered freeform tool's (syntax "lark" | "regex", definition) for its raw-text
    input ("" syntax: any text). Names are bare in `functions`, `ns.name` in a client namespace (or an MCP
    server's label). `builtin_calls`: the built-in tools the gateway runs, by recipient (`python`,
    `browser.search`, ...): the header the model writes after `<|channel|>` and its input's JSON schema (None:
    any text). The analysis channel is never constrained.
    """

    tools: Literal["any", "none", "required"] = "any"
    tool_names: tuple[str, ...] = ()
    final_json_schema: dict[str, Any] | None = None
    tool_parameters: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    tool_grammars: dict[str, tuple[str, str]] = field(default_factory=dict)
    builtin_calls: dict[str, tuple[str, dict[str, Any] | None]] = field(default_factory=dict)

    @property
    def is_free(self) -> bool:
        enforced_inputs = any(syntax for syntax, _ in self.tool_grammars.values())
        return self.tools == "any" and self.final_json_schema is None and not enforced_inputs


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability, and the `top` most likely tokens at its step (most likely first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class GenerateRequest:
    prompt: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    request_id: str
    sampling: Sampling = field(default_factory=Sampling)
    constraint: Constraint = field(default_factory=Constraint)
    cache_key: str | None = None  # requests sharing it share a prompt prefix: a backend may route them together
    tenant: str = ""  # whose request: an in-process prefix cache reuses a prompt only within its tenant
    top_logprobs: int | None = None  # None: no logprobs; else each token's, with this many alternatives (0-20)
    weight: float = 1.0  # the tenant's weight in an engine's fair share (its tokens count 1/weight)
    tier: SchedulingTier = "default"  # priority runs ahead of default, flex only on what the others leave
    # the answer's first tokens, written by a server that failed before the answer ended: the prompt ends with them
    # and max_new_tokens counts what is left; a backend takes them as its own output so far (the constraint's state,
    # the penalties' counts)
    continues: tuple[int, ...] = ()
    # W3C trace context of the generation's span (`traceparent`, ...): remote backends send it as headers, so the
    # model server's spans join the trace; empty when tracing is off
    trace_context: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Chunk:
    tokens: list[int]
    cached_tokens: int | None = None  # prompt tokens the backend served from its prefix cache, when it says
    logprobs: list[TokenLogprob | None] | None = None  # one per token when the request asked (None: not given)


class BackendError(RuntimeError):
    """The backend could not finish the generation; the message is safe to show to API clients."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    context_length: int
    constraints: bool = False
    logprobs: bool = False  # fills Chunk.logprobs when GenerateRequest.top_logprobs asks
    prefix_cache: bool = False  # keeps a prompt's KV for later requests that start with it
    service_tiers: bool = False  # schedules by GenerateRequest.tier (else every tier runs as default)


@runtime_checkable
class Backend(Protocol):
    """Backends never see API objects; cancelling the iterator cancels the generation."""

    capabilities: Capabilities

    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]: ...

    async def ready(self) -> bool:
        """Whether it can take requests now (the gateway's readiness probe asks)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of an in-process engine's load (the gateway exports it as `gateway_engine_*` metrics)."""

    running: int  # sequences holding KV pages
    waiting: int  # sequences queued for pages (or for room in the batch)
    max_batch: int  # the most sequences running at once
    kv_tokens: int  # positions written by running sequences
    kv_capacity_tokens: int  # positions the full-attention pool holds
    decode_steps: int  # since start
    prefill_tokens: int
    decode_tokens: int
    prefix_lookup_tokens: int = 0  # prompt tokens of the sequences started, since start
    prefix_hit_tokens: int = 0  # of those, tokens reused from the prefix cache instead of prefilled
    prefix_blocks: int = 0  # pages the prefix cache names now
    prefix_evicted_blocks: int = 0  # named pages taken back for other sequences or the budget, since start
    kv_pages: dict[str, Any] = field(default_factory=dict)  # pool → its PoolStats (pages, in_use, cached, free)
    preemptions: int = 0  # sequences preempted for pages and run again later, since start
    queues: dict[tuple[str, str], TenantQueue] = field(default_factory=dict)  # (tenant, tier) → its sequences


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """One tenant's sequences at one service tier in an engine."""

    running: int
    waiting: int
    admitted: int  # sequences admitted for the first time, since start
    wait_seconds: float  # their time from arrival to admission, summed
    weight: float  # the tenant's fair-share weight


class ServerLoad(NamedTuple):
    """A model server's load as it says it: requests running and waiting, the prompt tokens they still have to run
    before their first tokens, and how many requests have some left."""

    running: int
    waiting: int
    filling: int = 0
    filling_prompts: int = 0


@dataclass(frozen=True, slots=True)
class ServerReport:
    """What a remote backend's router knows of one server."""

    load: float  # requests running and waiting there (its own count when it reports one, else this replica's)
    queued_tokens: int  # prompt tokens to run there before their first tokens (its own count, or this replica's)
    routed_pages: int  # pages of what was routed there, still remembered
    published_pages: int  # pages it says it holds (servers that publish their pages)
    events_in_sync: bool | None  # whether its page events are followed now (None: it publishes none)


@dataclass(frozen=True, slots=True)
class RoutingReport:
    """How a remote backend routed its generations, since start, and its servers now."""

    routed: dict[str, int]  # generations by how their server was chosen: prefix, load, key
    prompt_tokens: int  # prompt tokens of the routed generations
    matched_tokens: int  # of those, tokens the chosen server held (by its events, or by what was routed there)
    servers: dict[str, ServerReport]  # by URL
    warmups: int = 0  # hot prefixes sent ahead to a server that did not hold them (routing/warming.py)


class SharedRoutes(Protocol):
    """What the gateway's replicas sent to which server, shared (state/route_book.py: Redis). It never raises:
    what it cannot read is unknown, what it cannot write is lost."""

    async def lookup(self, scope: str, names: list[bytes]) -> list[str | None]:
        """The server each page was last sent to, None where none is remembered."""
        ...

    async def note(self, scope: str, names: list[bytes], server: str, ttl_s: float) -> None: ...


@runtime_checkable
class SharesRoutes(Protocol):
    """Optional for backends: those that route by what was sent where can share it with other replicas."""

    def share_routes(self, routes: SharedRoutes) -> None: ...


@runtime_checkable
class ReportsRouting(Protocol):
    """Optional for backends: those that choose among several servers say how."""

    def routing_stats(self) -> RoutingReport | None: ...


@runtime_checkable
class ReportsEngineStats(Protocol):
    """Optional for backends: those that run the model in-process say how loaded they are."""

    def engine_stats(self) -> EngineStats | None:
        """None until the engine is loaded."""
        ...


def parse_options(model: type[OptionsT], options: dict[str, Any], backend: str) -> OptionsT:
    """A backend's options, validated; a ValueError naming each bad option stops the gateway at start."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        problems = "; ".join(
            f"options.{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"{backend} backend: {problems}") from None
