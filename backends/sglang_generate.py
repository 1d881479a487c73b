"""SGLang's native `/generate` with `input_ids`, streamed.

Each event carries `output_ids` and `meta_info` (`completion_tokens`, `cached_tokens`, `finish_reason` as
`{"type": "stop", "matched": ID}`, `{"type": "length", ...}` or `{"type": "abort", "message": ...}`).
By default `output_ids` holds every token so far; with `--incremental-streaming-output` only the new
ones. `completion_tokens` tells the two apart, so either server setting works.
"""

from __future__ import annotations

from typing import Any

from harmony import HarmonyEncoding

from .base import GenerateRequest
from .remote import RemoteBackend
from .wire import Step, UpstreamProtocolError, UpstreamReported, count, error_text, raise_reported, token_ids


class SGLangGenerate:
    name = "sglang_generate"
    path = "/generate"
    logprobs = False  # not asked for: requests that want them are refused with a 400
    constraints = False  # the gateway checks the output instead
    prefix_cache = False  # no prewarm for `generate: false`
    publishes_pages = False  # routing by prefix is approximate: by what was sent there
    service_tiers = False  # every tier runs as default

    def body(self, request: GenerateRequest, model: str | None) -> dict[str, Any]:
        sampling = request.sampling
        params: dict[str, Any] = {
            "max_new_tokens": request.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop_token_ids": list(request.stop_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.presence_penalty:
            params["presence_penalty"] = sampling.presence_penalty
        if sampling.frequency_penalty:
            params["frequency_penalty"] = sampling.frequency_penalty
        return {"input_ids": request.prompt, "sampling_params": params, "stream": True}

    def step(self, payload: dict[str, Any], received: int) -> Step:
        raise_reported(payload)
        meta = payload.get("meta_info") or {}
        if not isinstance(meta, dict):
            raise UpstreamProtocolError("'meta_info' is not an object")
        tokens = token_ids(payload.get("output_ids"), "output_ids")
        if received and len(tokens) == meta.get("completion_tokens"):
            tokens = tokens[received:]  # cumulative output: keep what is new
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            raise UpstreamReported(error_text(finish.get("message") or "the server aborted the generation"))
        matched = finish.get("matched") if isinstance(finish, dict) else None
        return Step(
            tokens,
            finished=finish is not None,
            stop_token=matched if type(matched) is int else None,
            cached_tokens=count(meta.get("cached_tokens")),
        )


DIALECT = SGLangGenerate()


def from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> RemoteBackend:
    return RemoteBackend.from_options(DIALECT, options)
