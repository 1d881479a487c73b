"""Presence and frequency penalties in the engine: its greedy tokens with penalties are exactly those of a
step-by-step greedy loop over the same decoder that subtracts OpenAI's penalties from the logits of the text
tokens generated so far (Harmony's special tokens never penalised)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config

from backends.base import GenerateRequest, Sampling
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.paged_runner import PagedRunner
from harmony import load_harmony_encoding
from harmony.tokens import FIRST_SPECIAL

PROMPT = [200006, 17360, 200008, *range(3000, 3040), 200007, 200006, 173781]
STEPS = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("penalties") / "model", tiny_config(), "hf")


def _engine_tokens(checkpoint: Path, sampling: Sampling) -> list[int]:
    options = EngineOptions(
        checkpoint=str(checkpoint), max_positions=256, cache_dir=str(checkpoint.parent / "graphs"), max_batch=1
    )
    backend = EngineBackend(options, load_harmony_encoding())

    async def run() -> list[int]:
        await loaded(backend)
        tokens: list[int] = []
        async for chunk in backend.generate(GenerateRequest(PROMPT, STEPS, (), "p", sampling)):
            tokens += chunk.tokens
        await backend.aclose()
        return tokens

    return asyncio.run(run())


def _reference_tokens(checkpoint: Path, presence: float, frequency: float) -> list[int]:
    model = compiled_model(Checkpoint(checkpoint), GraphOptions(256), checkpoint.parent / "graphs")
    runtime = PagedRunner.create(str(model), tiny_config(), 1, 256, kernels=kernel_library())
    logits = runtime.prefill(0, PROMPT)
    counts: dict[int, int] = {}
    tokens: list[int] = []
    for step in range(STEPS):
        adjusted = logits.astype(np.float64)
        for token, times in counts.items():
            adjusted[token] -= frequency * times + presence
        token = int(np.argmax(adjusted))
        tokens.append(token)
        if token < FIRST_SPECIAL:
            counts[token] = counts.get(token, 0) + 1
        if step + 1 < STEPS:
            logits = runtime.decode([(0, token, len(PROMPT) + step)])[0]
    return tokens


def test_penalised_greedy_tokens_equal_a_step_by_step_reference(checkpoint):
    plain = _engine_tokens(checkpoint, Sampling(temperature=0))
    assert plain == _reference_tokens(checkpoint, 0.0, 0.0)
    penalised = _engine_tokens(checkpoint, Sampling(temperature=0, presence_penalty=0.4, frequency_penalty=0.3))
    assert penalised == _reference_tokens(checkpoint, 0.4, 0.3)
    assert penalised != plain  # the penalties changed the answer: the check above is not vacuous
    encouraged = _engine_tokens(checkpoint, Sampling(temperature=0, frequency_penalty=-2.0))
    assert encouraged == _reference_tokens(checkpoint, 0.0, -2.0)
