"""The request path both API skins share: recover CoT, build the prompt, size the answer, start turns."""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import Backend, Constraint, Sampling

from .conversation import BuiltPrompt, PromptSpec, build_prompt
from .cot_recovery import recover_cot
from .metrics import TurnObserver
from .services import Services
from .turn import Turn


@dataclass(slots=True)
class Plan:
    backend: Backend
    built: BuiltPrompt
    max_new_tokens: int


async def plan_turn(
    services: Services, tenant: str, backend: Backend, spec: PromptSpec, max_output: int | None
) -> Plan:
    """The prompt for the request; the answer may use what is left of the context, up to `max_output`."""
    spec.items = await recover_cot(services.store, tenant, spec.items)
    context = backend.capabilities.context_length
    built = build_prompt(services.renderer, spec, context)
    room = context - len(built.tokens)
    return Plan(backend, built, room if max_output is None else min(max_output, room))


def start_turn(
    services: Services,
    plan: Plan,
    sampling: Sampling,
    constraint: Constraint,
    request_id: str,
    observer: TurnObserver | None,
) -> Turn:
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
    )
