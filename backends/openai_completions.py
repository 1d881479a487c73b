"""OpenAI-compatible `/v1/completions` with token ids in and out: vLLM, and SGLang's OpenAI-compatible server.

Request: `prompt` as a list of token ids, `stop_token_ids`, `return_token_ids: true` (each streamed choice
then carries `token_ids`, the tokens new in that chunk), `stream_options.include_usage` (the last chunk
carries `usage`, with `prompt_tokens_details.cached_tokens` when the server reports cache hits).
A finished choice names the stop token it matched: `stop_reason` (vLLM) or `matched_stop` (SGLang).
Logprobs, when the request wants them: `logprobs: k` with `return_tokens_as_token_ids: true`, so each choice's
`logprobs` names tokens as `token_id:<id>` (`token_logprobs` per token, `top_logprobs` a map per token). vLLM
reports the model's raw logprobs (its default `logprobs_mode`): before penalties, temperature and top-p.
"""

from __future__ import annotations

from typing import Any

from harmony import HarmonyEncoding

from .base import GenerateRequest, TokenLogprob, parse_options
from .cache_salt import TenantSalt
from .remote import RemoteBackend, RemoteOptions
from .wire import Step, UpstreamProtocolError, count, raise_reported, token_ids

VLLM_PRIORITY = {"priority": -1, "default": 0, "flex": 1}  # vLLM schedules lower values first


class OpenAICompletions:
    name = "openai_completions"
    path = "/v1/completions"
    logprobs = True
    constraints = False  # the gateway checks the output instead
    prefix_cache = False  # no prewarm for `generate: false`
    publishes_pages = False  # routing by prefix is approximate: by what was sent there

    def __init__(self, salt: TenantSalt | None = None, priorities: bool = False) -> None:
        self.salt = salt  # the tenant's `cache_salt` for the server's prefix cache (vLLM), when set
        # the service tier as vLLM's `priority` (lower runs first; the server needs --scheduling-policy priority)
        self.service_tiers = priorities

    def body(self, request: GenerateRequest, model: str | None) -> dict[str, Any]:
        sampling = request.sampling
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "max_tokens": request.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop_token_ids": list(request.stop_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model is not None:
            body["model"] = model
        if self.salt is not None:
            body["cache_salt"] = self.salt(request.tenant)
        if self.service_tiers:
            body["priority"] = VLLM_PRIORITY[request.tier]
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.presence_penalty:
            body["presence_penalty"] = sampling.presence_penalty
        if sampling.frequency_penalty:
            body["frequency_penalty"] = sampling.frequency_penalty
        if request.top_logprobs is not None:
            body["logprobs"] = request.top_logprobs
            body["return_tokens_as_token_ids"] = True
        return body

    def step(self, payload: dict[str, Any], received: int) -> Step:
        raise_reported(payload)
        usage = payload.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
        choices = payload.get("choices") or []
        if not choices:
            return Step([], cached_tokens=cached)
        choice = choices[0]
        if not isinstance(choice, dict):
            raise UpstreamProtocolError("a choice is not an object")
        tokens = token_ids(choice.get("token_ids"), "token_ids")
        if "token_ids" not in choice and choice.get("text"):
            raise UpstreamProtocolError("text came without 'token_ids': the server does not support return_token_ids")
        matched = choice.get("stop_reason", choice.get("matched_stop"))
        return Step(
            tokens,
            finished=choice.get("finish_reason") is not None,
            stop_token=matched if type(matched) is int else None,
            cached_tokens=cached,
            logprobs=_logprobs(choice.get("logprobs"), len(tokens)),
        )


def _logprobs(value: Any, tokens: int) -> list[TokenLogprob | None] | None:
    """A choice's `logprobs` object, one entry per token of the event (alternatives most likely first)."""
    if value is None:
        return None
    chosen = value.get("token_logprobs") if isinstance(value, dict) else None
    if not isinstance(chosen, list) or len(chosen) != tokens:
        raise UpstreamProtocolError("'logprobs' does not match the event's 'token_ids'")
    alternatives = value.get("top_logprobs") or [None] * tokens
    if not isinstance(alternatives, list) or len(alternatives) != tokens:
        raise UpstreamProtocolError("'logprobs.top_logprobs' does not match the event's 'token_ids'")
    entries: list[TokenLogprob | None] = []
    for logprob, top in zip(chosen, alternatives, strict=True):
        if logprob is None:
            entries.append(None)
            continue
        if not isinstance(logprob, int | float) or not isinstance(top, dict | None):
            raise UpstreamProtocolError("a token's logprob is not a number")
        ranked = sorted(((_token_id(name), float(value)) for name, value in (top or {}).items()), key=lambda p: -p[1])
        entries.append(TokenLogprob(float(logprob), tuple(ranked)))
    return entries


def _token_id(name: Any) -> int:
    text = name.removeprefix("token_id:") if isinstance(name, str) else ""
    if not text.isdigit() or text == name:
        raise UpstreamProtocolError("logprobs name tokens without 'token_id:' (return_tokens_as_token_ids unsupported)")
    return int(text)


def vllm_from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> RemoteBackend:
    """vLLM: every request carries its tenant's `cache_salt` unless the options turn it off."""
    parsed = parse_options(RemoteOptions, options, "vllm")
    salt = TenantSalt(parsed.cache_salt_secret_env) if parsed.cache_salt is not False else None
    return RemoteBackend(OpenAICompletions(salt, parsed.priority_scheduling), parsed, salt)


def sglang_from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> RemoteBackend:
    """SGLang's OpenAI-compatible server: a `cache_salt` only where the options ask (recent releases take it)."""
    parsed = parse_options(RemoteOptions, options, "sglang")
    if parsed.priority_scheduling:
        raise ValueError("sglang backend: options.priority_scheduling: only the vllm kind sends service tiers")
    salt = TenantSalt(parsed.cache_salt_secret_env) if parsed.cache_salt else None
    return RemoteBackend(OpenAICompletions(salt), parsed)
