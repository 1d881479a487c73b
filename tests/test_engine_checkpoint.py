"""Random checkpoints in both layouts load to the same tensors; broken checkpoints fail with an error
naming the file or tensor."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from engine_fixtures import make_checkpoint, tiny_config
from safetensors.numpy import load_file, save_file

from backends.engine.checkpoint import INDEX, Checkpoint, expected
from backends.engine.config import CheckpointError, ModelConfig

CONFIG = tiny_config(experts=4, top_k=2, vocab=1024)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "original": make_checkpoint(root / "original", CONFIG, "original"),
        "hf": make_checkpoint(root / "hf", CONFIG, "hf", shard_bytes=300_000),
    }


def test_both_layouts_hold_the_same_model(checkpoints):
    original, hf = Checkpoint(checkpoints["original"]), Checkpoint(checkpoints["hf"])
    assert (original.layout, hf.layout) == ("original", "hf")
    assert original.config == hf.config == CONFIG
    assert (checkpoints["hf"] / INDEX).is_file() and len(list(checkpoints["hf"].glob("*.safetensors"))) > 1
    for name in expected(CONFIG):
        assert np.array_equal(original.tensor(name), hf.tensor(name)), name
    hf_config = json.loads((checkpoints["hf"] / "config.json").read_text())
    assert hf_config["num_local_experts"] == 4 and hf_config["rope_scaling"]["factor"] == 32.0
    assert hf_config["layer_types"] == ["sliding_attention", "full_attention"]


def test_the_original_subdirectory_of_a_hub_download_is_found(tmp_path):
    make_checkpoint(tmp_path / "original", CONFIG, "original")
    assert Checkpoint(tmp_path).config == CONFIG


def test_real_model_shapes_have_the_published_parameter_counts():
    for layers, experts, billions in ((24, 32, 20.91), (36, 128, 116.83)):
        config = ModelConfig(num_hidden_layers=layers, num_experts=experts)
        total = 0
        for name, spec in expected(config).items():
            count = int(np.prod(spec.shape))
            total += count * 2 if name.endswith(".blocks") else 0 if name.endswith(".scales") else count
        assert round(total / 1e9, 2) == billions


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def _rewrite(directory: Path, change) -> None:
    """Load the one safetensors file, let `change` edit the dict, save it back."""
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: t.pop("block.1.attn.sinks"), "tensor 'block.1.attn.sinks' is missing"),
        (
            lambda t: t.update({"block.0.mlp.gate.bias": np.zeros(5, ml_dtypes.bfloat16)}),
            "tensor 'block.0.mlp.gate.bias' has shape [5]; the config says [4]",
        ),
        (
            lambda t: t.update({"norm.scale": np.zeros(64, np.float16)}),
            "tensor 'norm.scale' is F16; gpt-oss stores it as BF16",
        ),
    ],
    ids=["missing", "mis-shaped", "dtype"],
)
def test_a_damaged_tensor_is_named(checkpoints, tmp_path, damage, message):
    broken = _copy(checkpoints["original"], tmp_path / "broken")
    _rewrite(broken, damage)
    with pytest.raises(CheckpointError) as error:
        Checkpoint(broken)
    assert message in str(error.value)


def test_a_missing_hf_projection_is_named_with_its_original_name(checkpoints, tmp_path):
    broken = _copy(checkpoints["hf"], tmp_path / "broken")
    index = json.loads((broken / INDEX).read_text())
    shard = broken / index["weight_map"]["model.layers.1.self_attn.k_proj.weight"]
    tensors = load_file(str(shard))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError) as error:
        Checkpoint(broken)
    assert "'model.layers.1.self_attn.k_proj.weight' (block.1.attn.qkv.weight in the original layout)" in str(
        error.value
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"),
            "not a readable safetensors file",
        ),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{"), "not readable JSON"),
        (lambda d: (d / "config.json").write_text(json.dumps({"hidden_size": 64})), "missing or bad field"),
        (lambda d: (d / "model.safetensors").unlink(), "no *.safetensors files"),
    ],
    ids=["corrupt-weights", "no-config", "bad-json", "incomplete-config", "no-weights"],
)
def test_a_damaged_file_is_named(checkpoints, tmp_path, damage, message):
    broken = _copy(checkpoints["original"], tmp_path / "broken")
    damage(broken)
    with pytest.raises(CheckpointError) as error:
        Checkpoint(broken)
    assert message in str(error.value)


def test_an_index_naming_a_missing_shard_is_refused(checkpoints, tmp_path):
    broken = _copy(checkpoints["hf"], tmp_path / "broken")
    victim = sorted(broken.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(CheckpointError) as error:
        Checkpoint(broken)
    assert victim.name in str(error.value)
