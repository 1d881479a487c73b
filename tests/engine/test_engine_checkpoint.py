"""Random checkpoints in both layouts load to the same tensors; broken checkpoints fail with an error
naming the file or tensor."""

from __future__ import annotations

import json
import subprocess
import sys
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
            lambda t: t.update({"norm.scale": np.zeros(64, np.int32)}),
            "tensor 'norm.scale' is I32; gpt-oss stores it as BF16",
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


def test_a_transformers_5_config_with_rope_parameters_reads_the_same(checkpoints, tmp_path):
    moved = _copy(checkpoints["hf"], tmp_path / "hf5")
    config = json.loads((moved / "config.json").read_text())
    scaling = config.pop("rope_scaling")
    config["rope_parameters"] = {**scaling, "rope_theta": config.pop("rope_theta")}
    (moved / "config.json").write_text(json.dumps(config))
    assert Checkpoint(moved).config == CONFIG


def test_float32_and_float16_norms_biases_and_sinks_convert_exactly(checkpoints, tmp_path):
    """transformers saves these in float32; every bf16 value is exact in float32 (and, at these
    magnitudes, in float16), so the converted graph's weights are the same numbers."""
    widened = _copy(checkpoints["original"], tmp_path / "widened")

    def widen(tensors: dict[str, np.ndarray]) -> None:
        for name, array in list(tensors.items()):
            if name.endswith(("scale", "bias", "sinks")) and array.dtype == ml_dtypes.bfloat16:
                wide = np.float16 if name.endswith("sinks") else np.float32
                tensors[name] = array.astype(np.float32).astype(wide)

    _rewrite(widened, widen)
    plain, wide = Checkpoint(checkpoints["original"]), Checkpoint(widened)
    assert wide.tensor("block.0.attn.sinks").dtype == np.float16
    assert wide.tensor("norm.scale").dtype == np.float32
    for name in expected(CONFIG):
        a, b = plain.tensor(name), wide.tensor(name)
        assert np.array_equal(a.astype(np.float32), b.astype(np.float32)), name


def test_dequantized_experts_are_refused_with_what_to_do(checkpoints, tmp_path):
    fine_tune = _copy(checkpoints["hf"], tmp_path / "fine-tune")
    index = json.loads((fine_tune / INDEX).read_text())
    shard = fine_tune / index["weight_map"]["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    tensors = load_file(str(shard))
    for name in [n for n in tensors if n.startswith("model.layers.0.mlp.experts.gate_up_proj_")]:
        del tensors[name]
    tensors["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((4, 64, 128), ml_dtypes.bfloat16)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError) as error:
        Checkpoint(fine_tune)
    message = str(error.value)
    assert "experts are dequantized" in message and "'model.layers.0.mlp.experts.gate_up_proj'" in message
    assert "MXFP4" in message


def test_a_tensor_reads_without_ml_dtypes_imported_first(checkpoints):
    code = (
        "import sys; from backends.engine.checkpoint import Checkpoint; "
        f"print(Checkpoint({str(checkpoints['original'])!r}).tensor('norm.scale').dtype)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "bfloat16"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("transpose", [False, True])
def test_large_weights_are_converted_block_by_block_to_the_same_bytes(tmp_path, monkeypatch, dtype, transpose):

    from backends.engine import graph

    monkeypatch.setattr(graph, "STREAM_BLOCK_BYTES", 4096)  # many blocks, a partial last one
    matrix = np.random.default_rng(0).standard_normal((301, 45)).astype(ml_dtypes.bfloat16)
    writer = graph.TensorWriter(tmp_path / "data")
    writer.tensor("pad", 1, [3], np.zeros(3, np.float32))  # an unaligned start
    proto = writer.converted("w", matrix, np.dtype(dtype), transpose)
    writer.close()
    expected = matrix.astype(np.float32).astype(dtype)
    expected = np.ascontiguousarray(expected.T if transpose else expected)
    where = {entry.key: entry.value for entry in proto.external_data}
    written = (tmp_path / "data").read_bytes()[int(where["offset"]) :][: int(where["length"])]
    assert list(proto.dims) == list(expected.shape) and written == expected.tobytes()
    assert int(where["offset"]) % graph.DATA_ALIGNMENT == 0
