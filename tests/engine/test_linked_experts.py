"""The decoder graph reads the experts' MXFP4 codes and scales from the checkpoint's own files (hard links beside
the graph) instead of a copy: the graph's data file holds everything but them, the logits equal those of a graph
whose experts were copied (as where linking fails), and the graph outlives the checkpoint directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from engine_fixtures import make_checkpoint, tiny_config

from backends.engine import graph
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.paged_runner import PagedRunner

PROMPT = [200006, 17360, 200008, *range(3000, 3040)]


def _logits(model: Path) -> list[np.ndarray]:
    runtime = PagedRunner.create(str(model), tiny_config(), 1, 128, kernels=kernel_library())
    rows = [runtime.prefill(0, PROMPT)]
    for step in range(4):
        rows.append(runtime.decode([(0, int(np.argmax(rows[-1])), len(PROMPT) + step)])[0])
    return rows


def _expert_bytes(checkpoint: Checkpoint) -> int:
    names = [f"block.{n}.mlp.mlp{fc}_weight.{part}" for n in range(2) for fc in (1, 2) for part in ("blocks", "scales")]
    return sum(checkpoint.tensor(name).nbytes for name in names)


@pytest.mark.parametrize("layout", ["original", "hf"])
def test_experts_are_read_from_the_checkpoints_files(tmp_path, monkeypatch, layout):
    directory = make_checkpoint(tmp_path / "model", tiny_config(), layout)
    checkpoint = Checkpoint(directory)
    linked = compiled_model(checkpoint, GraphOptions(128), tmp_path / "graphs-linked")
    links = sorted(linked.parent.glob("linked-*"))
    shards = {os.stat(shard).st_ino for shard in directory.rglob("*.safetensors")}
    assert links and {os.stat(link).st_ino for link in links} <= shards  # the same files, not copies

    def no_links(source, target):
        raise OSError("another file system")

    monkeypatch.setattr(graph.os, "link", no_links)
    copied = compiled_model(checkpoint, GraphOptions(128), tmp_path / "graphs-copied")
    assert not list(copied.parent.glob("linked-*"))
    linked_data = linked.with_name(linked.name + ".data").stat().st_size
    copied_data = copied.with_name(copied.name + ".data").stat().st_size
    assert copied_data - linked_data >= _expert_bytes(checkpoint)  # the copy holds them; the linked graph not

    want = _logits(copied)
    shutil.rmtree(directory)  # the links keep the experts' bytes
    for got, expected in zip(_logits(linked), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_zero_experts_checkpoint_is_sparse_and_serves(tmp_path):
    """`zero_experts`: the codes and scales are holes in the shards (no disk blocks), the checkpoint reads them
    as zeros, and its graph (experts linked, so still no copy) decodes on the kernels."""
    config = tiny_config()
    directory = make_checkpoint(tmp_path / "zero", config, "hf", zero_experts=True)
    full = make_checkpoint(tmp_path / "full", config, "hf")
    used = sum(path.stat().st_blocks * 512 for path in directory.glob("*.safetensors"))
    apparent = sum(path.stat().st_size for path in directory.glob("*.safetensors"))
    checkpoint = Checkpoint(directory)
    experts = _expert_bytes(checkpoint)
    assert apparent == sum(path.stat().st_size for path in full.glob("*.safetensors"))
    assert used <= apparent - experts + 64 * 1024  # the experts' bytes take no blocks
    assert not checkpoint.tensor("block.1.mlp.mlp2_weight.blocks").any()
    model = compiled_model(checkpoint, GraphOptions(128), tmp_path / "graphs")
    bf16_weights = apparent - experts
    assert model.with_name(model.name + ".data").stat().st_size < 2 * bf16_weights + 2**20  # in float32; no experts
    rows = _logits(model)
    assert all(np.isfinite(row).all() for row in rows)
