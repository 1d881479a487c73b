"""The MoE kernel's table of launch variants (moe_tuning.py, moe_variants.h): written by a GPU sweep, read at
load for the engine's GPU model and shape, an operator's GATEWAY_MOE_VARIANTS first; the kernel reads the same
text as the Python side and refuses what is not a table."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from paths import ROOT

from backends.engine.config import ModelConfig
from backends.engine.kernels import moe_tuning
from backends.engine.kernels.build import build_library
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.op_models import moe_layer_model

H200 = moe_tuning.GpuModel("NVIDIA H200", "9.0")
TABLES = [
    "1=tiles/4;8=tiles/2;128=tiles/1;4096=gemm",
    "1=cores",
    "2048=tiles/16",
    "1000000000=gemm",
]
NOT_TABLES = [
    "",
    "1=tiles/4;",
    "4=tiles/1;2=cores",  # bounds not increasing
    "4=tiles/1;4=cores",
    "0=cores",
    "1=tiles/0",
    "1=tiles/17",
    "1=tiles",
    "1=gemms",
    "x=cores",
    "1=cores;;2=gemm",
    " 1=cores",
    "+1=cores",
    "1=tiles/+2",
    "01=cores",
    ";".join(f"{n}=cores" for n in range(1, 34)),  # more entries than the kernel keeps
]


@pytest.mark.parametrize("text", TABLES)
def test_a_table_is_valid_text_on_both_sides(text, tmp_path, monkeypatch):
    assert moe_tuning.valid(text)
    monkeypatch.setenv(moe_tuning.VARIANTS_ENV, text)
    _session(tmp_path)  # the kernel takes it


@pytest.mark.parametrize("text", NOT_TABLES)
def test_what_is_not_a_table_is_refused_on_both_sides_naming_the_variable(text, tmp_path, monkeypatch):
    assert not moe_tuning.valid(text)
    if text == "":
        return  # empty: no table to the kernel (it runs its built-in rule); the Python side never writes it
    monkeypatch.setenv(moe_tuning.VARIANTS_ENV, text)
    with pytest.raises(Exception, match=moe_tuning.VARIANTS_ENV):
        _session(tmp_path)


def test_the_cpu_kernel_computes_the_same_under_any_table(tmp_path, monkeypatch):
    """The table chooses among CUDA paths only: the CPU kernel's output is the same with or without one."""
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    logits = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    plain = _session(tmp_path / "plain").run(None, {"x": x, "router_logits": logits})[0]
    monkeypatch.setenv(moe_tuning.VARIANTS_ENV, TABLES[0])
    tabled = _session(tmp_path / "tabled").run(None, {"x": x, "router_logits": logits})[0]
    assert np.array_equal(plain, tabled)


def test_the_fastest_variant_per_size_becomes_one_entry_per_run_of_sizes():
    fastest = {1: "tiles/4", 2: "tiles/4", 4: "tiles/2", 8: "tiles/1", 16: "tiles/1", 1024: "gemm", 2048: "gemm"}
    assert moe_tuning.compact(fastest) == "2=tiles/4;4=tiles/2;16=tiles/1;2048=gemm"
    assert moe_tuning.valid(moe_tuning.compact(fastest))
    assert moe_tuning.compact({8: "cores", 1: "cores"}) == "8=cores"


def _table(tmp_path, entries: list[dict]) -> object:
    path = tmp_path / "moe_tuning.json"
    path.write_text(json.dumps({"tables": entries}))
    return path


def test_the_engine_takes_its_gpu_model_and_shape_s_entry(tmp_path, monkeypatch):
    monkeypatch.delenv(moe_tuning.VARIANTS_ENV, raising=False)
    path = _table(
        tmp_path,
        [
            {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "experts": 32, "variants": "8=cores"},
            {"device": H200.name, "compute_capability": "9.0", "experts": 128, "variants": "8=tiles/2"},
            {"device": H200.name, "compute_capability": "9.0", "experts": 32, "variants": TABLES[0]},
        ],
    )
    said = moe_tuning.apply(32, H200, path)
    assert os.environ[moe_tuning.VARIANTS_ENV] == TABLES[0]
    assert said == f"tuned for NVIDIA H200 (9.0): {TABLES[0]}"


@pytest.mark.parametrize(
    ("gpu", "entries"),
    [
        (None, [{"device": H200.name, "compute_capability": "9.0", "experts": 32, "variants": "8=cores"}]),
        (moe_tuning.GpuModel("NVIDIA A100-SXM4-80GB", "8.0"), [{"device": H200.name, "compute_capability": "9.0",
                                                                 "experts": 32, "variants": "8=cores"}]),
        (H200, [{"device": H200.name, "compute_capability": "9.0", "experts": 32, "variants": "8=warp9"}]),
        (H200, [{"device": H200.name, "compute_capability": "10.0", "experts": 32, "variants": "8=cores"}]),
    ],
    ids=["no GPU", "another GPU", "a malformed entry", "another capability"],
)  # fmt: skip
def test_without_an_entry_for_it_the_engine_keeps_the_kernel_s_rule(gpu, entries, tmp_path, monkeypatch):
    monkeypatch.delenv(moe_tuning.VARIANTS_ENV, raising=False)
    assert moe_tuning.apply(32, gpu, _table(tmp_path, entries)) == "built-in rule"
    assert moe_tuning.VARIANTS_ENV not in os.environ


def test_an_operator_s_own_variants_win_over_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv(moe_tuning.VARIANTS_ENV, "1=cores")
    path = _table(tmp_path, [{"device": H200.name, "compute_capability": "9.0", "experts": 32, "variants": "8=gemm"}])
    assert moe_tuning.apply(32, H200, path) == f"{moe_tuning.VARIANTS_ENV} as set: 1=cores"
    assert os.environ[moe_tuning.VARIANTS_ENV] == "1=cores"


def test_the_committed_table_is_well_formed():
    """Every entry names its GPU model, capability and shape, with variants the kernel reads."""
    table = json.loads(moe_tuning.TABLE.read_text())
    for entry in table["tables"]:
        assert entry["device"] and entry["compute_capability"] and entry["experts"] > 0
        assert moe_tuning.valid(entry["variants"])


def test_without_a_cuda_driver_no_gpu_is_named():
    if moe_tuning.cuda_gpu() is not None:
        pytest.skip("this machine has a CUDA driver and a GPU")
    assert moe_tuning.cuda_gpu(0) is None


def _session(directory) -> ort.InferenceSession:
    config = ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=64)
    directory.mkdir(parents=True, exist_ok=True)
    model = moe_layer_model(config, random_moe_layer(config, seed=0), directory)
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(build_library(cuda=False)))
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def test_a_sweep_writes_the_table_the_engine_then_reads(tmp_path, monkeypatch):
    """The sweep's whole path, run on the CPU at a small shape (its kernel ignores the variants, so which is
    fastest is noise here; on a GPU each is a different launch): every candidate and the rule timed at every
    size, a table written for the GPU model (the committed file's other GPUs kept), the docs section rendered,
    and the engine's load reading the new entry."""
    sys.path.insert(0, str(ROOT / "bench"))
    import moe_sweep
    from engine_check_report import markdown

    committed = tmp_path / "moe_tuning.json"
    other = {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "experts": 32, "variants": "8=cores"}
    committed.write_text(json.dumps({"about": "kept", "tables": [other]}))
    monkeypatch.setattr(moe_tuning, "TABLE", committed)
    monkeypatch.setattr(moe_tuning, "BUCKETS", (1, 3, 8))
    monkeypatch.setattr(moe_tuning, "cuda_gpu", lambda ordinal=0: H200)
    small = ModelConfig(num_experts=8, experts_per_token=2, hidden_size=64, intermediate_size=64)
    monkeypatch.setattr(moe_sweep, "SHAPES", {"20b": small})
    monkeypatch.setattr(moe_sweep, "CHECKED_SIZES", (1, 3))
    monkeypatch.delenv(moe_tuning.VARIANTS_ENV, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    report = moe_sweep.moe_sweep(tmp_path / "work", build_library(cuda=False), "cpu", out, lambda line: None)
    shape = report["20b"]
    assert set(shape["us"]) == {"rule", *moe_tuning.CANDIDATES} and all(len(t) == 3 for t in shape["us"].values())
    assert set(shape["fastest"]) == {1, 3, 8} and moe_tuning.valid(shape["variants"])
    assert all(difference == 0.0 for difference in shape["largest_difference_from_cores"].values())  # CPU: one path
    written = json.loads((out / "moe_tuning.json").read_text())
    assert written == json.loads(committed.read_text())
    assert written["about"] == "kept" and written["tables"][0] == other
    assert written["tables"][1] == {"device": H200.name, "compute_capability": "9.0", "experts": 8,
                                    "dtype": "bfloat16", "variants": shape["variants"]}  # fmt: skip
    section = markdown({"sweep": json.loads(json.dumps(report))})  # as --render reads it back
    assert f"`{shape['variants']}`" in section and "| 8 |" in section
    assert moe_tuning.apply(8, H200) == f"tuned for NVIDIA H200 (9.0): {shape['variants']}"
