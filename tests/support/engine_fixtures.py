"""Small random-weight gpt-oss checkpoints for the engine tests, built once per session."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.engine.checkpoint import Checkpoint
from backends.engine.config import GPT_OSS_20B, ModelConfig
from backends.engine.graph import GraphOptions
from backends.engine.make_checkpoint import write_random_checkpoint
from backends.engine.model_cache import compiled_model

# gpt-oss-20b's width (hidden 2880, vocabulary 201,088) at two layers of four experts: the real-width tests' model
REAL_WIDTH = replace(GPT_OSS_20B, num_hidden_layers=2, num_experts=4, experts_per_token=2)
REAL_WIDTH_PROMPT = [200006, 17360, 200008, 3575, 553, 261, 10297, 29186, 13, 200007, 200006, 1428, 200008, 13225]


def tiny_config(experts: int = 8, top_k: int = 4, layers: int = 2, vocab: int = 201088) -> ModelConfig:
    """gpt-oss in miniature: real vocabulary, window, rotary and MXFP4 experts; small widths."""
    return ModelConfig(
        num_hidden_layers=layers,
        num_experts=experts,
        experts_per_token=top_k,
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=8,
        num_key_value_heads=2,
    )


def make_checkpoint(directory: Path, config: ModelConfig, layout: str, seed: int = 7, **kwargs) -> Path:
    return write_random_checkpoint(directory, config, layout, seed=seed, **kwargs)  # type: ignore[arg-type]


def export_model(checkpoint_dir: Path, max_positions: int) -> str:
    """The decoder graph of a checkpoint, built into a cache next to it; the .onnx path."""
    return str(compiled_model(Checkpoint(checkpoint_dir), GraphOptions(max_positions), checkpoint_dir / "graphs"))


def kernel_builds() -> dict[str, str]:
    """The kernels built for this machine ("native"), and for the CPU alone every variant an image ships
    (variants.py) that this CPU can run; test_kernel_variants.py names the others as skipped."""
    from backends.engine.kernels import build
    from backends.engine.kernels.variants import runs_here, variants

    built = {"native": str(build.build_library())}
    for variant in variants():
        if variant.name != "native" and runs_here(variant):
            library = build.build_library(march=variant.march, cuda=False, extensions=variant.extensions)
            built[variant.name] = str(library)
    return built


async def loaded(backend: Any, timeout_s: float = 600) -> Any:
    """The engine backend once it has loaded (its status never `failed` meanwhile, at most `timeout_s`)."""
    started = time.monotonic()
    while not await backend.ready():
        assert backend.describe()["status"] != "failed", backend.describe()
        assert time.monotonic() - started < timeout_s, "the engine did not load"
        await asyncio.sleep(0.02)
    return backend


def kernel_session(model: Path | str, library: str | None) -> Any:
    """A CPU session of `model` with the compiled kernel `library` registered (None: the graph's functions)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def greedy_tokens(options: Any, prompt: list[int], count: int) -> list[int]:
    """`count` greedy tokens for `prompt` through the public engine backend built with `options` (EngineOptions)."""
    from backends.base import GenerateRequest, Sampling
    from backends.engine.backend import EngineBackend
    from harmony import load_harmony_encoding

    backend = EngineBackend(options, load_harmony_encoding())

    async def run() -> list[int]:
        await loaded(backend)
        tokens: list[int] = []
        async for chunk in backend.generate(GenerateRequest(prompt, count, (), "greedy", Sampling(temperature=0))):
            tokens += chunk.tokens
        await backend.aclose()
        return tokens

    return asyncio.run(run())
