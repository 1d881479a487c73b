"""What a create's body alone decides: its options, its tools and, where nothing stored adds to it, its prompt's
length. A checker process runs these on a large body before the gateway spends its own time on it
(checker_pool.py); the request path checks the same again, in the same order, so a body gets the same 4xx
either way."""

from __future__ import annotations

from typing import Any

from backends.base import Capabilities

from ..errors import invalid
from ..generation.dialog import Call
from ..generation.prompt import check_prompt_fits
from ..intake.checker_pool import checker_renderer
from ..intake.json_body import parse_model
from ..tenants.limits import TenantLimits
from .input import checked_tools, prompt_spec
from .models.request import REQUEST_TAGS, ResponsesRequest
from .models.tools import CustomTool, FunctionTool, NamespaceTool


def wants_logprobs(req: ResponsesRequest) -> bool:
    return "message.output_text.logprobs" in req.include or bool(req.top_logprobs)


def check_options(req: ResponsesRequest, capabilities: Capabilities) -> None:
    """The options the model's backend or the store must support."""
    if wants_logprobs(req) and not capabilities.logprobs:
        param = "top_logprobs" if req.top_logprobs else "include"
        raise invalid(param, "This model's backend does not return logprobs.", "unsupported_parameter")
    if req.background and not req.store:
        raise invalid("background", "background responses need store: true.", "unsupported_parameter")


def check_create(body: Any, limits: TenantLimits, capabilities: dict[str, Capabilities]) -> None:
    """A create's body: a 4xx as the request path would give it, or nothing where it passes (or where what
    decides comes later: an unknown model's 404)."""
    req = parse_model(body, ResponsesRequest, REQUEST_TAGS)
    served = capabilities.get(req.model)
    if served is None:
        return
    check_options(req, served)
    tools, _ = checked_tools(req, limits)
    if req.previous_response_id or req.conversation_id or req.truncation == "auto" or req.context_management:
        return  # the prompt holds what is stored, or drops turns or compacts them to fit
    sealed: list[str] = []

    def unseal(blob: str, purpose: str) -> str:
        sealed.append(purpose)  # the replica's keys open it; left out here, it only shortens the prompt
        return ""

    spec = prompt_spec(req, tools, [], unseal)  # without the server-side tools (the replica lists them)
    whole = not sealed and all(isinstance(tool, FunctionTool | CustomTool | NamespaceTool) for tool in req.tools)
    whole = whole and not any(isinstance(item, Call) for item in spec.items)  # calls may get their CoT back
    check_prompt_fits(checker_renderer(), spec, served.context_length, whole)
