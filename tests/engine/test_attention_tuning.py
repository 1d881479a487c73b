"""The CUDA decode attention's table of key splits (attention_tuning.py, attention_splits.h): written by a GPU sweep,
read at load for the engine's GPU model, an operator's GATEWAY_ATTENTION_SPLITS first; the op reads the same text as
the Python side, refuses what is not a table, and picks a decode step's split by its rows (checked through the
kernel file compiled for the host); the sweep's whole path runs on the CPU at a small shape."""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from emulated_kernels import compile_emulated
from paths import ROOT

from backends.engine.config import ModelConfig
from backends.engine.kernels import attention_tuning, build, moe_tuning
from backends.engine.kernels.build import build_library

sys.path.insert(0, str(ROOT / "bench"))
from attention_layer import attention_model

H200 = moe_tuning.GpuModel("NVIDIA H200", "9.0")
TABLES = ["1=256;8=512;64=1024;256=0", "1=0", "1000000000=4096", "2=1048576"]
NOT_TABLES = [
    "",
    "1=256;",
    "8=256;2=512",  # bounds not increasing
    "8=256;8=512",
    "0=256",
    "1=-1",
    "1=+256",
    "1=0256",
    "1=1048577",
    "1=a",
    "1=256;;2=0",
    " 1=256",
    "01=256",
    ";".join(f"{n}=256" for n in range(1, 34)),  # more entries than the op keeps
]
CONFIG = ModelConfig(num_hidden_layers=2)  # gpt-oss's attention heads (64 query, 8 KV, 64 wide)


def _session(tmp_path) -> ort.InferenceSession:
    model = tmp_path / "attention.onnx"
    model.write_bytes(attention_model(CONFIG, 0, 1, 64))
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(build_library(cuda=False)))
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("text", TABLES)
def test_a_table_is_valid_text_on_both_sides(text, tmp_path, monkeypatch):
    assert attention_tuning.valid(text)
    monkeypatch.setenv(attention_tuning.SPLITS_ENV, text)
    _session(tmp_path)  # the op takes it


@pytest.mark.parametrize("text", NOT_TABLES)
def test_what_is_not_a_table_is_refused_on_both_sides_naming_the_variable(text, tmp_path, monkeypatch):
    assert not attention_tuning.valid(text)
    if text == "":
        return  # empty: no table (the kernel's default); the Python side never writes it
    monkeypatch.setenv(attention_tuning.SPLITS_ENV, text)
    with pytest.raises(Exception, match=attention_tuning.SPLITS_ENV):
        _session(tmp_path)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    library = compile_emulated(
        build.ATTENTION_CUDA_SOURCE,
        "attention_emulation_driver.cc",
        "gptoss_emulated_attention",
        tmp_path_factory.mktemp("splits"),
        "-O0",
    )
    library.gptoss_split_keys_for.restype = ctypes.c_int64
    library.gptoss_split_keys_for.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    return library


def test_a_decode_step_takes_the_entry_of_its_rows_and_the_default_past_the_last(emulated):
    table = b"1=256;8=512;64=0"
    picked = {rows: emulated.gptoss_split_keys_for(table, rows) for rows in (1, 2, 8, 9, 64, 65, 256)}
    assert picked == {1: 256, 2: 512, 8: 512, 9: 0, 64: 0, 65: 1024, 256: 1024}
    assert emulated.gptoss_split_keys_for(b"", 4) == 1024
    for text in NOT_TABLES[1:]:
        assert emulated.gptoss_split_keys_for(text.encode(), 4) == -1, text


def test_the_engine_takes_its_gpu_model_s_entry_and_an_operator_s_own_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(attention_tuning.SPLITS_ENV, raising=False)
    path = tmp_path / "attention_tuning.json"
    entries = [
        {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "splits": "8=0"},
        {"device": H200.name, "compute_capability": "9.0", "splits": TABLES[0]},
    ]
    path.write_text(json.dumps({"tables": entries}))
    assert attention_tuning.apply(H200, path) == f"tuned for NVIDIA H200 (9.0): {TABLES[0]}"
    assert os.environ[attention_tuning.SPLITS_ENV] == TABLES[0]
    assert attention_tuning.apply(H200, path) == f"{attention_tuning.SPLITS_ENV} as set: {TABLES[0]}"
    monkeypatch.delenv(attention_tuning.SPLITS_ENV)
    for gpu, table in (
        (None, entries),
        (moe_tuning.GpuModel("NVIDIA A100-SXM4-80GB", "8.0"), entries),
        (H200, [{"device": H200.name, "compute_capability": "9.0", "splits": "8=many"}]),
    ):
        path.write_text(json.dumps({"tables": table}))
        assert attention_tuning.apply(gpu, path) == "built-in rule"
        assert attention_tuning.SPLITS_ENV not in os.environ


def test_the_committed_table_is_well_formed():
    table = json.loads(attention_tuning.TABLE.read_text())
    for entry in table["tables"]:
        assert entry["device"] and entry["compute_capability"] and attention_tuning.valid(entry["splits"])


def test_a_sweep_writes_the_table_the_engine_then_reads(tmp_path, monkeypatch):
    """The sweep's whole path, on the CPU at small rows and contexts (its kernel does not split, so which candidate
    is fastest is noise here; on a GPU each is a different launch): every candidate timed at every case, the
    outputs equal, a table written for the GPU model (the committed file's other GPUs kept), the docs section
    rendered, and the engine's load reading the new entry."""
    import attention_sweep
    from engine_check_report import markdown

    committed = tmp_path / "attention_tuning.json"
    other = {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "splits": "8=0"}
    committed.write_text(json.dumps({"about": "kept", "tables": [other]}))
    monkeypatch.setattr(attention_tuning, "TABLE", committed)
    monkeypatch.setattr(attention_tuning, "ROWS", (1, 2, 4))
    monkeypatch.setattr(attention_tuning, "CONTEXTS", (64, 256))
    monkeypatch.setattr(attention_sweep, "CAP_POSITIONS", 512)
    monkeypatch.setattr(attention_sweep, "REPEATS", 2)
    monkeypatch.setattr(moe_tuning, "cuda_gpu", lambda ordinal=0: H200)
    monkeypatch.delenv(attention_tuning.SPLITS_ENV, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    report = attention_sweep.attention_sweep(
        tmp_path / "work", build_library(cuda=False), "cpu", out, lambda line: None, CONFIG
    )
    assert set(report["us"]) == {str(k) for k in attention_tuning.CANDIDATES}
    assert all(set(times) == {"1x64", "1x256", "2x64", "2x256", "4x64"} for times in report["us"].values())
    assert set(report["fastest"]) == {"1", "2", "4"} and attention_tuning.valid(report["splits"])
    assert all(difference == 0.0 for difference in report["largest_difference_from_default"].values())
    written = json.loads((out / "attention_tuning.json").read_text())
    assert written == json.loads(committed.read_text())
    assert written["about"] == "kept" and written["tables"][0] == other
    assert written["tables"][1] == {"device": H200.name, "compute_capability": "9.0", "dtype": "bfloat16",
                                    "splits": report["splits"]}  # fmt: skip
    section = markdown({"attention_sweep": json.loads(json.dumps(report))})
    assert f"`{report['splits']}`" in section
    assert attention_tuning.apply(H200) == f"tuned for NVIDIA H200 (9.0): {report['splits']}"
    assert np.isfinite([t for times in report["us"].values() for t in times.values()]).all()
