"""The request path both API skins share: recover CoT, build the prompt, size the answer, start turns."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from backends.base import Backend, Constraint, Sampling, SchedulingTier
from harmony import HarmonyEncoding
from harmony.render import Renderer
from state import ResponseStore

from ..intake.costly_work import CostlyWork
from ..observability.metrics import TurnObserver
from ..observability.tracing import traced
from ..process.lifecycle import Lifecycle
from .assembler import CallRouting, OutputAssembler
from .cot_recovery import recover_cot
from .dialog import Entry
from .prompt import BuiltPrompt, PromptSpec, build_prompt
from .turn import Turn


class CoreServices(Protocol):
    """What the core uses of the gateway's services (gateway/services.py's Services is one)."""

    @property
    def renderer(self) -> Renderer: ...

    @property
    def store(self) -> ResponseStore: ...

    @property
    def encoding(self) -> HarmonyEncoding: ...

    @property
    def lifecycle(self) -> Lifecycle: ...

    @property
    def costly(self) -> CostlyWork: ...

    def engine_weight(self, tenant: str) -> float:
        """The tenant's weight in an engine's fair share."""
        ...


@dataclass(slots=True)
class Plan:
    backend: Backend
    built: BuiltPrompt
    max_new_tokens: int


T = TypeVar("T")
OFFLOAD_CHARS = 64 * 1024  # below this much text a render takes well under the ~80 µs a thread hop costs


async def off_the_loop_if_large(
    services: CoreServices, tenant: str, body_bytes: int | None, work: Callable[[], T]
) -> T:
    """`work` (checking a request's schemas, say) as the tenant's costly work, in a worker thread, when the body
    is large enough for it to take long, else here: the event loop serves everyone else."""
    if body_bytes is None or body_bytes > OFFLOAD_CHARS:
        return await services.costly.run(tenant, work)
    return work()


def _large(spec: PromptSpec, body_bytes: int | None) -> bool:
    """Whether the prompt may hold OFFLOAD_CHARS of text: a large body, or a long stored history."""
    if body_bytes is None or body_bytes > OFFLOAD_CHARS:
        return True
    total = body_bytes
    for entry in spec.history:
        total += sum(len(part) for part in entry.message.content if isinstance(part, str))
        if total > OFFLOAD_CHARS:
            return True
    return False


async def plan_turn(
    services: CoreServices,
    tenant: str,
    backend: Backend,
    spec: PromptSpec,
    max_output: int | None,
    body_bytes: int | None,
) -> Plan:
    """The prompt for the request; the answer may use what is left of the context, up to `max_output`.

    A large prompt renders in a worker thread: BPE on megabytes of text takes seconds (tiktoken releases
    the GIL), and the event loop serves every other client meanwhile. `body_bytes`: the request's size."""
    context = backend.capabilities.context_length
    built = await _render(services, tenant, spec, context, body_bytes)
    room = context - len(built.tokens)
    return Plan(backend, built, room if max_output is None else min(max_output, room))


async def count_prompt(services: CoreServices, tenant: str, spec: PromptSpec, body_bytes: int | None) -> int:
    """The prompt's length in tokens as a create would render it (recovered CoT included), whatever it fits."""
    return len((await _render(services, tenant, spec, UNBOUNDED, body_bytes)).tokens)


UNBOUNDED = 2**62


async def plan_continuation(
    services: CoreServices, plan: Plan, spec: PromptSpec, dialog: list[Entry], left: int
) -> Plan:
    """The prompt once a tool the gateway runs has answered: the whole dialog so far rendered again (the
    turn in progress keeps its chain of thought); the answer may use `left` more tokens, as the context allows."""
    continued = dataclasses.replace(spec, items=[], history=dialog)
    context = plan.backend.capabilities.context_length
    built = await asyncio.to_thread(build_prompt, services.renderer, continued, context)
    return Plan(plan.backend, built, min(left, context - len(built.tokens)))


@traced("gateway.render_prompt")
async def _render(
    services: CoreServices, tenant: str, spec: PromptSpec, budget: int, body_bytes: int | None
) -> BuiltPrompt:
    spec.items = await recover_cot(services.store, tenant, spec.items)
    if _large(spec, body_bytes):
        return await services.costly.run(tenant, lambda: build_prompt(services.renderer, spec, budget))
    return build_prompt(services.renderer, spec, budget)


def start_turn(
    services: CoreServices,
    tenant: str,
    plan: Plan,
    sampling: Sampling,
    constraint: Constraint,
    request_id: str,
    observer: TurnObserver | None,
    routing: CallRouting | None = None,
    cache_key: str | None = None,
    assembler: OutputAssembler | None = None,
    top_logprobs: int | None = None,
    deltas: bool = True,
    tier: SchedulingTier = "default",
) -> Turn:
    """`deltas`: the answer's text as Delta events too (a stream's listener or a stop matcher reads them);
    `tier`: the service tier applied (tenants/service_tiers.py)."""
    tokens = plan.built.tokens
    return Turn(
        plan.backend,
        services.encoding,
        tokens,
        plan.max_new_tokens,
        sampling,
        constraint,
        request_id,
        observer,
        services.lifecycle,
        routing,
        cache_key,
        assembler,
        tenant,
        top_logprobs,
        deltas,
        services.engine_weight(tenant),
        tier,
    )
