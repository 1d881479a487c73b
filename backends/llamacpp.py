"""llama.cpp's server: `/completion` with the prompt as a token array, streamed with `return_tokens`.

Each event carries `tokens` (the new token ids) and `stop`; the last one (`stop: true`) adds `stop_type`
and `timings.cache_n` (prompt tokens reused from the slot's cache). llama.cpp takes no stop token ids:
the gpt-oss GGUF marks `<|return|>` and `<|call|>` end-of-generation, and the gateway enforces them too.
Its sampler defaults (top-k 40, min-p 0.05, repetition penalty) are turned off so that sampling is
what the API request asked for.
"""

from __future__ import annotations

from typing import Any

from harmony import HarmonyEncoding

from .base import GenerateRequest
from .remote import RemoteBackend
from .wire import Step, UpstreamProtocolError, count, raise_reported, token_ids


class LlamaCppCompletion:
    name = "llamacpp"
    path = "/completion"
    logprobs = False  # not asked for: requests that want them are refused with a 400
    constraints = False  # the gateway checks the output instead
    prefix_cache = False  # no prewarm for `generate: false`
    publishes_pages = False  # routing by prefix is approximate: by what was sent there
    service_tiers = False  # every tier runs as default

    def body(self, request: GenerateRequest, model: str | None) -> dict[str, Any]:
        sampling = request.sampling
        return {
            "prompt": request.prompt,
            "n_predict": request.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "seed": -1 if sampling.seed is None else sampling.seed,
            "cache_prompt": True,
            "return_tokens": True,
            "stream": True,
        }

    def step(self, payload: dict[str, Any], received: int) -> Step:
        raise_reported(payload)
        tokens = token_ids(payload.get("tokens"), "tokens")
        finished = payload.get("stop") is True
        timings = payload.get("timings") or {}
        if not isinstance(timings, dict):
            raise UpstreamProtocolError("'timings' is not an object")
        return Step(tokens, finished=finished, cached_tokens=count(timings.get("cache_n")) if finished else None)


DIALECT = LlamaCppCompletion()


def from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> RemoteBackend:
    return RemoteBackend.from_options(DIALECT, options)
