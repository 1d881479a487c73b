"""The host's cost per decode step, counted as the engine serves (backends/engine/host_costs.py) and reported by
engine_check's `host` step: a decode step is one run of the decoder's graph and one of the sampler's (or, without
the compiled kernels, the decoder's alone and the logits read back for NumPy), the host waits for the device's
results once a step, and its inputs are the rows' ids, positions, page tables and sampling rows."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from engine_fixtures import loaded, make_checkpoint, tiny_config
from paths import ROOT

from backends.engine.backend import EngineBackend, EngineOptions
from harmony import load_harmony_encoding

sys.path.insert(0, str(ROOT / "bench"))
from engine_check_report import markdown
from host_costs_check import decode_costs


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("host-costs") / "model", tiny_config(), "original")


def _costs(checkpoint: Path, kernels: bool, batch: int) -> dict[str, float]:
    async def scenario() -> dict[str, float]:
        options = EngineOptions(
            checkpoint=str(checkpoint),
            max_batch=batch,
            max_positions=512,
            cache_dir=str(checkpoint.parent / "graphs"),
            kernels=kernels,
        )
        engine = await loaded(EngineBackend(options, load_harmony_encoding()))
        try:
            assert engine.host_costs() is not None
            return await decode_costs(engine, batch, 48)
        finally:
            await engine.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "portable"])
def test_a_decode_step_runs_each_session_once_and_waits_once(checkpoint, kernels):
    figures = _costs(checkpoint, kernels, batch=3)
    # the common decode steps of 48 tokens past the first few: on a busy CI machine the first request was 12 tokens
    # ahead of the last one's first tokens (24 tokens left 11 common steps)
    assert figures["loops"] >= 15
    assert figures["runs"] == (2 if kernels else 1)
    assert figures["syncs"] == 1
    assert 0 < figures["host_ms"] < figures["loop_ms"]
    assert 0 < figures["host_share"] < 1
    # ids (int64) and positions (int32) of 3 rows, two page tables of 3 rows: with the kernels also the sampling rows
    assert figures["input_bytes"] >= 3 * 8 + 3 * 4 + 2 * 3 * 4


def test_engine_check_renders_the_host_step():
    host = {
        "device": "cpu",
        "cpu": "Test CPU (avx2)",
        "layers": 2,
        "batch_1": dict(loops=50, loop_ms=12.5, host_ms=0.8, host_share=0.064, runs=2, syncs=1, input_bytes=1234),
    }
    text = markdown({"host": host})
    assert "The host's cost per decode step** (cpu, Test CPU (avx2);" in text
    assert "| 1 | 12.50 ms | 0.800 ms | 6.4% | 2 | 1 | 1,234 |" in text
    assert "failed: boom" in markdown({"host": {"error": "boom"}})
