"""Logprobs from the built-in engine: each generated token's is the log-softmax, at the real vocabulary
width (201,088), of the logits it was sampled from (penalties applied, before temperature), as a step-by-step
float64 reference over the same decoder computes it, to float32's precision (the sampler kernel's output);
the alternatives are the most likely tokens, most likely first,
and a token the output's grammar masks out is never among them. Through both APIs, the answer's tokens carry
them (never the reasoning's), in the final object and in the stream."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openai
import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway

from backends.base import GenerateRequest, Sampling, TokenLogprob
from backends.engine.backend import MOE_INT8_PIECES, EngineBackend, EngineOptions, moe_activations
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.paged_runner import PagedRunner
from backends.engine.sampler import RowSpec, sample_rows, sampling_rows
from backends.engine.sampling_session import SamplingSession
from harmony import load_harmony_encoding
from harmony.tokens import FIRST_SPECIAL

PROMPT = [200006, 17360, 200008, *range(5000, 5030), 200007, 200006, 173781]
STEPS = 16
TOP = 5
PRESENCE = 0.7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("logprobs") / "model", tiny_config(), "hf")


def _engine(checkpoint: Path, sampling: Sampling) -> tuple[list[int], list[TokenLogprob]]:
    options = EngineOptions(
        checkpoint=str(checkpoint), max_positions=256, cache_dir=str(checkpoint.parent / "graphs"), max_batch=1
    )
    backend = EngineBackend(options, load_harmony_encoding())

    async def run() -> tuple[list[int], list[TokenLogprob]]:
        await loaded(backend)
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        request = GenerateRequest(PROMPT, STEPS, (), "lp", sampling, top_logprobs=TOP)
        async for chunk in backend.generate(request):
            tokens += chunk.tokens
            assert chunk.logprobs is not None and len(chunk.logprobs) == len(chunk.tokens)
            logprobs += [entry for entry in chunk.logprobs if entry is not None]
        await backend.aclose()
        return tokens, logprobs

    return asyncio.run(run())


def _reference(checkpoint: Path, tokens: list[int]) -> list[np.ndarray]:
    """The penalised float64 log-softmax at each step of the engine's own token sequence."""
    pieces = MOE_INT8_PIECES[moe_activations(EngineOptions(), "cpu")]  # the engine's default MoE decode on the CPU
    graph = GraphOptions(256, moe_int8_pieces=pieces)
    model = compiled_model(Checkpoint(checkpoint), graph, checkpoint.parent / "graphs")
    runtime = PagedRunner.create(str(model), tiny_config(), 1, 256, kernels=kernel_library())
    logits = runtime.prefill(0, PROMPT)
    seen: set[int] = set()
    rows = []
    for step, token in enumerate(tokens):
        adjusted = logits.astype(np.float64)
        adjusted[sorted(seen)] -= PRESENCE
        rows.append(adjusted - (adjusted.max() + np.log(np.exp(adjusted - adjusted.max()).sum())))
        if token < FIRST_SPECIAL:
            seen.add(token)
        if step + 1 < len(tokens):
            logits = runtime.decode([(0, token, len(PROMPT) + step)])[0]
    return rows


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_each_tokens_logprob_is_the_exact_log_softmax_it_was_sampled_from(checkpoint, temperature):
    tokens, logprobs = _engine(checkpoint, Sampling(temperature=temperature, seed=11, presence_penalty=PRESENCE))
    assert len(tokens) == len(logprobs) == STEPS
    for token, entry, row in zip(tokens, logprobs, _reference(checkpoint, tokens), strict=True):
        assert entry.logprob == pytest.approx(row[token], abs=2e-6)  # before temperature: the same at 0 and 0.8
        best = np.argsort(-row, kind="stable")[:TOP]
        assert [token for token, _ in entry.top] == best.tolist()
        assert [value for _, value in entry.top] == pytest.approx(row[best].tolist(), abs=2e-6)
        if temperature == 0:
            assert entry.top[0][0] == token  # greedy took the most likely


def test_a_masked_token_is_never_an_alternative_at_the_real_width():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((1, 201_088)).astype(np.float32)
    logits[0, [7, 11, 13]] = 40.0
    allowed = np.full(201_088 // 32, 0xFFFFFFFF, np.uint32)
    allowed[0] &= ~np.uint32((1 << 7) | (1 << 13))  # a grammar allows 11 of the three
    rows = sampling_rows([RowSpec(0, Sampling(temperature=0), np.random.default_rng(0), allowed, None, 4)], 201_088)
    value = ort.OrtValue.ortvalue_from_numpy(logits)
    kernel = SamplingSession(kernel_library(), ["CPUExecutionProvider"], ("cpu", 0), value).sample(rows)
    finite = np.delete(logits[0], [7, 13]).astype(np.float64)
    expected = 40.0 - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))
    for sampled in (kernel, sample_rows(logits, rows)):
        entry = sampled.entry(0, 4)
        assert sampled.tokens[0] == 11 and entry.top[0][0] == 11 and not {7, 13} & set(dict(entry.top))
        assert entry.logprob == pytest.approx(expected, abs=1e-6)
        assert len(entry.top) == 4 and all(np.isfinite(value) for _, value in entry.top)


# ---- through the public API: Responses and Chat on the engine, a JSON answer the grammar holds the model to ----

MODEL = "gpt-oss-20b"
UNIT = {
    "type": "object",
    "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def live(tmp_path_factory, checkpoint):
    directory = tmp_path_factory.mktemp("logprobs-api")
    options = {"checkpoint": str(checkpoint), "max_positions": 1024, "cache_dir": str(checkpoint.parent / "graphs")}
    settings = gateway_settings(directory, backends={"engine": {"kind": "onnx", "options": options, "models": [MODEL]}})
    gateway = LiveGateway(settings).start()
    gateway.wait_until_ready(MODEL)
    yield gateway
    gateway.stop()


def _check_answer(entries, text: str, top: int) -> None:
    """The entries spell the answer exactly; a choice the grammar left open (the enum) has alternatives that
    share all of the probability, most likely first; a forced token has probability 1."""
    assert "".join(entry.token for entry in entries) == text and text.startswith('{"unit"')
    assert b"".join(bytes(entry.bytes) for entry in entries) == text.encode()
    for entry in entries:
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) <= top and entry.logprob <= 0
    open_choice = [entry for entry in entries if len(entry.top_logprobs) >= 2]
    assert open_choice, "the enum's two values were both allowed somewhere"
    for entry in open_choice:  # the allowed tokens share all of the probability: the listed ones at most all
        mass = sum(math.exp(alternative.logprob) for alternative in entry.top_logprobs)
        assert mass == pytest.approx(1.0, abs=1e-6) if len(entry.top_logprobs) < top else mass <= 1.0 + 1e-9
    forced = [entry for entry in entries if len(entry.top_logprobs) == 1]
    assert all(entry.logprob == pytest.approx(0.0, abs=1e-9) for entry in forced)


def test_responses_and_chat_carry_the_engines_logprobs_for_the_answer_alone(live):
    api = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-tenant-a", max_retries=0, timeout=120)
    schema = {"type": "json_schema", "name": "unit", "schema": UNIT, "strict": True}
    asked = {"model": MODEL, "input": "unit?", "temperature": 0, "max_output_tokens": 300, "text": {"format": schema}}
    asked |= {"include": ["message.output_text.logprobs"], "top_logprobs": 3}
    response = api.responses.create(**asked)
    (message,) = [item for item in response.output if item.type == "message"]
    _check_answer(message.content[0].logprobs, response.output_text, 3)
    events = list(api.responses.create(**asked, stream=True))
    streamed = [entry for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    expected = [e.logprob for e in message.content[0].logprobs]  # greedy: the same answer (its prompt now reused
    assert [e.logprob for e in streamed] == pytest.approx(expected, abs=1e-5)  # from the cache: float32 rounding)
    chat_format = {"type": "json_schema", "json_schema": {"name": "unit", "schema": UNIT, "strict": True}}
    chat_asked = {"model": MODEL, "messages": [{"role": "user", "content": "unit?"}], "temperature": 0}
    chat_asked |= {"max_tokens": 300, "response_format": chat_format, "logprobs": True, "top_logprobs": 2}
    chat = api.chat.completions.create(**chat_asked)
    _check_answer(chat.choices[0].logprobs.content, chat.choices[0].message.content, 2)
    assert chat.choices[0].message.content == response.output_text
    chunks = list(api.chat.completions.create(**chat_asked, stream=True))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    _check_answer(entries, chat.choices[0].message.content, 2)
