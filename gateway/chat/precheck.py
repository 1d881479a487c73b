"""What a chat completion's body alone decides: its options, its schemas and its prompt's length (nothing stored
adds to a chat prompt but the chain of thought of calls it replays). A checker process runs these on a large body
before the gateway spends its own time on it (checker_pool.py); the request path checks the same again, in the
same order, so a body gets the same 4xx either way."""

from __future__ import annotations

from typing import Any

from backends.base import Capabilities

from ..errors import invalid
from ..generation.dialog import Call
from ..generation.prompt import check_prompt_fits
from ..intake.checker_pool import checker_renderer
from ..intake.json_body import parse_model
from ..tenants.limits import TenantLimits
from .input import checked_constraint, prompt_spec
from .models import CHAT_UNION_TAGS, ChatRequest


def check_options(req: ChatRequest, capabilities: Capabilities) -> None:
    """The options this gateway and the model's backend support."""
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true.")
    if req.logprobs and not capabilities.logprobs:
        raise invalid("logprobs", "This model's backend does not return logprobs.", "unsupported_parameter")
    if req.logit_bias:
        raise invalid("logit_bias", "logit_bias is not supported by this gateway.", "unsupported_parameter")
    if req.store:
        raise invalid(
            "store", "Stored chat completions are not supported; use the Responses API.", "unsupported_parameter"
        )


def check_chat(body: Any, limits: TenantLimits, capabilities: dict[str, Capabilities]) -> None:
    """A chat completion's body: a 4xx as the request path would give it, or nothing where it passes (or where
    what decides comes later: an unknown model's 404)."""
    req = parse_model(body, ChatRequest, CHAT_UNION_TAGS)
    served = capabilities.get(req.model)
    if served is None:
        return
    check_options(req, served)
    checked_constraint(req, limits)
    spec = prompt_spec(req)
    whole = not any(isinstance(item, Call) for item in spec.items)  # calls may get their CoT back
    check_prompt_fits(checker_renderer(), spec, served.context_length, whole)
