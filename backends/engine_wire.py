"""The engine server's token protocol: a GenerateRequest as JSON in, the generation's chunks as SSE out.

POST `/v1/engine/generate` with the body `request_body(request)` (`continues`: the last prompt tokens are the
answer's first, written by a server that failed) gives a `text/event-stream` of `data:` events,
each a JSON object: `{"tokens": [...], "logprobs": [...]?, "cached_tokens": n?}` as tokens come (the first
carries `cached_tokens`), then `{"tokens": [], "finished": true}`; a failure after the stream began is one
`{"error": {"message", "type"}}` event. A request refused before it starts is an HTTP error with the same
`error` object: 400 (`invalid_request`: the body or the prompt), 401 (`unauthorized`), 503 (`not_ready`,
`draining`: try another server). The W3C trace context travels as headers (`traceparent`, `tracestate`).

Both sides import this module: the gateway's `engine` backend kind (without the engine's runtime) and the
engine server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import Chunk, Constraint, GenerateRequest, Sampling, SchedulingTier, TokenLogprob
from .wire import Step, UpstreamProtocolError, count, raise_reported, token_ids

GENERATE_PATH = "/v1/engine/generate"
EVENTS_PATH = "/v1/engine/kv_events"
INFO_PATH = "/v1/engine/info"
MAX_PROMPT_TOKENS = 1 << 20
MAX_TOP_LOGPROBS = 20


def request_body(request: GenerateRequest) -> dict[str, Any]:
    """The JSON body that carries `request` (all but its trace context, which goes as headers)."""
    sampling, constraint = request.sampling, request.constraint
    body: dict[str, Any] = {
        "prompt": request.prompt,
        "max_new_tokens": request.max_new_tokens,
        "stop_ids": list(request.stop_ids),
        "request_id": request.request_id,
        "tenant": request.tenant,
        "weight": request.weight,
        "tier": request.tier,
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
        },
    }
    if request.cache_key is not None:
        body["cache_key"] = request.cache_key
    if request.continues:
        body["continues"] = list(request.continues)
    if request.top_logprobs is not None:
        body["top_logprobs"] = request.top_logprobs
    if constraint != Constraint():
        body["constraint"] = {
            "tools": constraint.tools,
            "tool_names": list(constraint.tool_names),
            "final_json_schema": constraint.final_json_schema,
            "tool_parameters": constraint.tool_parameters,
            "tool_grammars": {name: list(pair) for name, pair in constraint.tool_grammars.items()},
            "builtin_calls": {name: list(pair) for name, pair in constraint.builtin_calls.items()},
        }
    return body


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WireSampling(_Strict):
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)


class WireConstraint(_Strict):
    tools: Literal["any", "none", "required"] = "any"
    tool_names: list[str] = Field(default_factory=list)
    final_json_schema: dict[str, Any] | None = None
    tool_parameters: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    tool_grammars: dict[str, tuple[str, str]] = Field(default_factory=dict)
    builtin_calls: dict[str, tuple[str, dict[str, Any] | None]] = Field(default_factory=dict)


class WireRequest(_Strict):
    prompt: list[int] = Field(min_length=1, max_length=MAX_PROMPT_TOKENS)
    max_new_tokens: int = Field(ge=1)
    stop_ids: list[int] = Field(default_factory=list, max_length=64)
    request_id: str = Field(default="", max_length=256)
    tenant: str = Field(default="", max_length=256)
    weight: float = Field(default=1.0, gt=0, le=1000)
    tier: SchedulingTier = "default"
    cache_key: str | None = Field(default=None, max_length=1024)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    sampling: WireSampling = Field(default_factory=WireSampling)
    constraint: WireConstraint = Field(default_factory=WireConstraint)
    continues: list[int] = Field(default_factory=list, max_length=MAX_PROMPT_TOKENS)

    @model_validator(mode="after")
    def _continues_ends_the_prompt(self) -> WireRequest:
        if self.continues and (
            len(self.continues) >= len(self.prompt) or self.prompt[-len(self.continues) :] != self.continues
        ):
            raise ValueError("continues must be the last tokens of the prompt, after at least one other")
        return self

    def generate_request(self, trace_context: dict[str, str]) -> GenerateRequest:
        sampling, constraint = self.sampling, self.constraint
        return GenerateRequest(
            prompt=self.prompt,
            max_new_tokens=self.max_new_tokens,
            stop_ids=tuple(self.stop_ids),
            request_id=self.request_id,
            sampling=Sampling(**sampling.model_dump()),
            constraint=Constraint(
                tools=constraint.tools,
                tool_names=tuple(constraint.tool_names),
                final_json_schema=constraint.final_json_schema,
                tool_parameters=constraint.tool_parameters,
                tool_grammars=constraint.tool_grammars,
                builtin_calls=constraint.builtin_calls,
            ),
            cache_key=self.cache_key,
            tenant=self.tenant,
            weight=self.weight,
            tier=self.tier,
            top_logprobs=self.top_logprobs,
            continues=tuple(self.continues),
            trace_context=trace_context,
        )


def chunk_event(chunk: Chunk, cached_tokens: int | None) -> dict[str, Any]:
    """The event that carries `chunk` (logprobs as `[logprob, [[token, logprob], ...]]` or null per token)."""
    event: dict[str, Any] = {"tokens": chunk.tokens}
    if cached_tokens is not None:
        event["cached_tokens"] = cached_tokens
    if chunk.logprobs is not None:
        event["logprobs"] = [
            None if entry is None else [entry.logprob, [list(pair) for pair in entry.top]] for entry in chunk.logprobs
        ]
    return event


FINISHED_EVENT = {"tokens": [], "finished": True}


def error_object(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


class EngineDialect:
    """The gateway's side of the protocol, for RemoteBackend."""

    name = "engine"
    path = GENERATE_PATH
    logprobs = True
    constraints = True  # the engine enforces them while it samples
    prefix_cache = True
    publishes_pages = True  # GET /v1/engine/kv_events: routing by prefix knows what each server holds
    service_tiers = True  # the engine schedules by the request's tier

    def body(self, request: GenerateRequest, model: str | None) -> dict[str, Any]:
        return request_body(request)

    def step(self, payload: dict[str, Any], received: int) -> Step:
        raise_reported(payload)
        tokens = token_ids(payload.get("tokens"), "tokens")
        return Step(
            tokens,
            finished=payload.get("finished") is True,
            cached_tokens=count(payload.get("cached_tokens")),
            logprobs=_logprobs(payload.get("logprobs"), len(tokens)),
        )


def _logprobs(value: Any, tokens: int) -> list[TokenLogprob | None] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != tokens:
        raise UpstreamProtocolError("'logprobs' does not match the event's 'tokens'")
    entries: list[TokenLogprob | None] = []
    for entry in value:
        if entry is None:
            entries.append(None)
            continue
        try:
            logprob, top = entry
            ranked = tuple((int(token), float(alternative)) for token, alternative in top)
            entries.append(TokenLogprob(float(logprob), ranked))
        except (TypeError, ValueError):
            raise UpstreamProtocolError("a token's logprob entry is not [logprob, [[token, logprob], ...]]") from None
    return entries
