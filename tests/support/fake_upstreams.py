"""In-repo token servers speaking each remote dialect as its project documents it, for backend tests.

A FakeUpstream answers with the tokens a mock script gives for the prompt, streamed in its dialect:
- `vllm`: `/v1/completions`, one chunk per token with `token_ids` (the first adds `prompt_token_ids`),
  the stop token included and named in `stop_reason`, then a usage chunk and `[DONE]`; with `logprobs: k`,
  each choice's `logprobs` (`fake_logprob` of the token and of k alternatives, named `token_id:<id>` when
  `return_tokens_as_token_ids`, else by their text);
- `sglang`: the same endpoint as SGLang serves it; the matched stop token is named in `matched_stop`
  and left out of `token_ids` (so the gateway's handling of servers that do not send it is exercised);
- `sglang_generate`: `/generate` with `output_ids` cumulative (SGLang's default) or, with
  `incremental=True`, new ids only, and `meta_info`;
- `llamacpp`: `/completion` with `tokens` per event and a final `stop: true` event with `timings`.
Requests are checked against the fields each server accepts; a malformed one gets a 400.
It records every call (body, tokens sent, whether the gateway aborted it, when) for assertions.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from threaded_server import ThreadedServer

from backends.base import GenerateRequest, Sampling
from backends.mock import MockBackend
from harmony import STOP_TOKENS_FOR_ASSISTANT_ACTIONS, load_harmony_encoding

STOPS = sorted(STOP_TOKENS_FOR_ASSISTANT_ACTIONS)

ACCEPTED_FIELDS = {
    "vllm": {
        "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop_token_ids",
        "skip_special_tokens", "return_token_ids", "stream", "stream_options", "presence_penalty", "frequency_penalty",
        "logprobs", "return_tokens_as_token_ids", "cache_salt", "priority",
    },
    "sglang_generate": {"input_ids", "sampling_params", "stream"},
    "llamacpp": {
        "prompt", "n_predict", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed",
        "cache_prompt", "return_tokens", "stream", "presence_penalty", "frequency_penalty",
    },
}  # fmt: skip
ACCEPTED_FIELDS["sglang"] = ACCEPTED_FIELDS["vllm"] - {"cache_salt", "priority"}  # cache_salt unless the options ask
SGLANG_SAMPLING_FIELDS = {
    "max_new_tokens", "temperature", "top_p", "stop_token_ids", "skip_special_tokens", "no_stop_trim", "sampling_seed",
    "presence_penalty", "frequency_penalty",
}  # fmt: skip
PATHS = {
    "vllm": "/v1/completions",
    "sglang": "/v1/completions",
    "sglang_generate": "/generate",
    "llamacpp": "/completion",
}


def fake_logprob(token: int) -> float:
    """The fake vLLM's logprob of a token, as the tests expect it."""
    return -((token % 7) + 1) / 10


@dataclass
class Call:
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    sent: list[float] = field(default_factory=list)  # monotonic times at which tokens were written
    aborted_at: float | None = None  # when the gateway closed the connection mid-stream
    finished: bool = False


class FakeUpstream:
    def __init__(
        self,
        dialect: str,
        script: dict[str, Any],
        *,
        port: int | None = None,
        token_delay_s: float = 0.0,
        cached_tokens: int = 7,
        incremental: bool = False,
        ignore_stops: bool = False,
        status: int | None = None,
        stall_after: int | None = None,
        error_after: int | None = None,
        logprobs_by_text: bool = False,  # names tokens by text even when asked for ids (an older server)
    ) -> None:
        self.dialect = dialect
        self.logprobs_by_text = logprobs_by_text
        self._server = ThreadedServer(port)
        self.port = self._server.port
        self.token_delay_s = token_delay_s
        self.cached_tokens = cached_tokens
        self.incremental = incremental
        self.ignore_stops = ignore_stops
        self.status = status
        self.stall_after = stall_after
        self.error_after = error_after
        self.encoding = load_harmony_encoding()
        self.mock = MockBackend(script, self.encoding)
        self.calls: list[Call] = []
        self.health_checks = 0

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> FakeUpstream:
        def make_app() -> web.Application:
            app = web.Application()
            app.router.add_post(PATHS[self.dialect], self._generate)
            app.router.add_get("/health", self._health)
            return app

        self._server.serve(make_app, handler_cancellation=True)
        return self

    def stop(self) -> None:
        self._server.close()

    def wait_for(self, predicate, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.json_response({"status": "ok"})

    def _check(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "the body is not an object"
        unknown = set(body) - ACCEPTED_FIELDS[self.dialect]
        if unknown:
            return f"unknown fields {sorted(unknown)}"
        prompt = body.get("input_ids" if self.dialect == "sglang_generate" else "prompt")
        if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
            return "the prompt must be a non-empty list of token ids"
        if body.get("stream") is not True:
            return "stream must be true"
        if self.dialect in ("vllm", "sglang"):
            if body.get("return_token_ids") is not True or body.get("skip_special_tokens") is not False:
                return "return_token_ids must be true and skip_special_tokens false"
            if sorted(body.get("stop_token_ids", [])) != STOPS or body.get("stream_options") != {"include_usage": True}:
                return "stop_token_ids and stream_options are missing"
        if self.dialect == "sglang_generate":
            params = body.get("sampling_params")
            if not isinstance(params, dict) or set(params) - SGLANG_SAMPLING_FIELDS:
                return "sampling_params has unknown fields"
            if sorted(params.get("stop_token_ids", [])) != STOPS:
                return "stop_token_ids are missing"
        if self.dialect == "llamacpp" and body.get("return_tokens") is not True:
            return "return_tokens must be true"
        return None

    def _limit(self, body: dict[str, Any]) -> int:
        if self.dialect == "sglang_generate":
            return body["sampling_params"]["max_new_tokens"]
        return body["n_predict" if self.dialect == "llamacpp" else "max_tokens"]

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        call = Call(body, dict(request.headers))
        self.calls.append(call)
        problem = self._check(body)
        if problem:
            return web.json_response({"error": {"message": problem, "type": "BadRequestError"}}, status=400)
        if self.status is not None:
            message = f"This model's maximum context length is 128 tokens (fake status {self.status})."
            return web.json_response({"object": "error", "message": message, "code": self.status}, status=self.status)
        prompt = body.get("input_ids") or body.get("prompt")
        stops = () if self.ignore_stops else tuple(STOPS)
        limit = self._limit(body)
        mock_request = GenerateRequest(prompt, limit + len(prompt), stops, "fake", Sampling())
        tokens = [t for chunk in [c async for c in self.mock.generate(mock_request)] for t in chunk.tokens]
        # a prompt that ends with the script's first tokens (an answer another server began): the script goes on
        begun = next((k for k in range(min(len(tokens), len(prompt)), 0, -1) if prompt[-k:] == tokens[:k]), 0)
        tokens = tokens[begun : begun + limit]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await self._stream(response, call, prompt, tokens, self._limit(body))
        except (asyncio.CancelledError, ConnectionError):
            call.aborted_at = time.monotonic()
            raise
        return response

    async def _stream(self, response: web.StreamResponse, call: Call, prompt: list[int], tokens: list[int], limit: int):
        sent: list[int] = []
        for index, token in enumerate(tokens):
            if index == self.stall_after:
                await asyncio.sleep(3600)
            if index == self.error_after:
                await self._event(response, {"error": {"message": "CUDA out of memory (fake)", "code": 500}})
                return
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            sent.append(token)
            last = index == len(tokens) - 1
            await self._event(response, self._token_event(prompt, sent, token, last, limit))
            call.sent.append(time.monotonic())
        for payload in self._closing_events(prompt, sent, limit):
            await self._event(response, payload)
        if self.dialect != "llamacpp":
            await response.write(b"data: [DONE]\n\n")
        call.finished = True

    async def _event(self, response: web.StreamResponse, payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    def _finish(self, sent: list[int], last: bool, limit: int) -> tuple[str | None, int | None]:
        if not last:
            return None, None
        if sent[-1] in STOPS:
            return "stop", sent[-1]
        return ("length" if len(sent) >= limit else "stop"), None

    def _token_event(self, prompt: list[int], sent: list[int], token: int, last: bool, limit: int) -> dict[str, Any]:
        reason, matched = self._finish(sent, last, limit)
        text = self.encoding.decode([token])
        if self.dialect in ("vllm", "sglang"):
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if self.dialect == "vllm":
                choice |= {"stop_reason": matched, "token_ids": [token]}
                body = self.calls[-1].body
                if body.get("logprobs") is not None:
                    as_ids = body.get("return_tokens_as_token_ids") and not self.logprobs_by_text
                    choice["logprobs"] = self._logprobs(token, body["logprobs"], as_ids)
            else:
                withheld = matched is not None
                choice |= {
                    "matched_stop": matched,
                    "token_ids": [] if withheld else [token],
                    "text": "" if withheld else text,
                }
            if len(sent) == 1:
                choice["prompt_token_ids"] = prompt
            return {"id": "cmpl-fake", "object": "text_completion", "model": "gpt-oss", "choices": [choice]}
        if self.dialect == "sglang_generate":
            finish = None if reason is None else {"type": reason, "matched": matched} if matched else {"type": reason}
            meta = {
                "id": "fake",
                "finish_reason": finish,
                "prompt_tokens": len(prompt),
                "completion_tokens": len(sent),
                "cached_tokens": self.cached_tokens,
            }
            ids = [token] if self.incremental else list(sent)
            return {"text": self.encoding.decode(sent), "output_ids": ids, "meta_info": meta}
        return {"index": 0, "content": text, "tokens": [token], "stop": False, "id_slot": 0}

    def _logprobs(self, token: int, top: int, as_ids: bool) -> dict[str, Any]:
        """vLLM's completions logprobs for one token: the chosen one's and the `top` most likely (the chosen
        among them, as vLLM adds it)."""

        def name(other: int) -> str:
            return f"token_id:{other}" if as_ids else self.encoding.decode_bytes([other]).decode("utf-8", "replace")

        ranked = {name(token): fake_logprob(token)}
        for rank in range(1, top):
            ranked[name(token + rank)] = fake_logprob(token) - rank
        return {"tokens": [name(token)], "token_logprobs": [fake_logprob(token)], "top_logprobs": [ranked]}

    def _closing_events(self, prompt: list[int], sent: list[int], limit: int) -> list[dict[str, Any]]:
        if self.dialect in ("vllm", "sglang"):
            details = {"cached_tokens": self.cached_tokens}
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(sent), "prompt_tokens_details": details}
            return [{"id": "cmpl-fake", "object": "text_completion", "model": "gpt-oss", "choices": [], "usage": usage}]
        if self.dialect == "llamacpp":
            stop_type = "limit" if len(sent) >= limit else "eos"
            timings = {"cache_n": self.cached_tokens, "prompt_n": len(prompt) - self.cached_tokens}
            return [{"index": 0, "content": "", "tokens": [], "stop": True, "stop_type": stop_type, "timings": timings}]
        return []
