"""`serve` runs the built-in engine by default (a random demo model, generated once, with a loud
warning), started as the README says (the installed `gpt-oss-gateway serve`), and the engine's command-line tools
write and convert checkpoints with progress."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import openai
import pytest
from engine_fixtures import tiny_config
from live_gateway import GatewayProcess

from backends.engine.backend import RANDOM_MODEL_WARNING
from backends.engine.checkpoint import Checkpoint
from backends.engine.config import DEMO_CONFIG
from backends.engine.kernels.build import KERNELS_ENV, build_library
from gateway.cli import main
from gateway.config import Settings

README_SERVE = (str(Path(sys.executable).parent / "gpt-oss-gateway"), "serve")  # the README's command, installed


def _serve_default(tmp_path, name: str) -> GatewayProcess:
    # a fresh cache for the model and graph; the kernels built once for the whole suite, not again here
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), KERNELS_ENV: str(build_library())}
    unset = ("GATEWAY_BACKEND",)
    return GatewayProcess(env, tmp_path / f"{name}.log", unset=unset, command=README_SERVE).start(timeout_s=180)


def test_serve_with_no_backend_configured_runs_the_engine_on_a_random_model(tmp_path):
    first = _serve_default(tmp_path, "first")
    try:
        client = openai.OpenAI(base_url=first.url + "/v1", api_key="sk-x", max_retries=0)
        response = client.responses.create(model="gpt-oss-20b", input="Hi", max_output_tokens=16, temperature=0)
        assert response.status in ("completed", "incomplete") and 0 < response.usage.output_tokens <= 16
    finally:
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=60) == 0
    log = first.log_text()
    assert RANDOM_MODEL_WARNING in log and "engine_random_model" in log and "engine_graph_build" in log
    demo = tmp_path / "cache" / "gpt-oss-gateway" / "graphs" / "random-demo-model"
    assert Checkpoint(demo).config == DEMO_CONFIG
    second = _serve_default(tmp_path, "second")  # the demo model and its graph are reused, not rebuilt
    second.stop()
    assert RANDOM_MODEL_WARNING in second.log_text() and "engine_graph_build" not in second.log_text()


def test_make_checkpoint_writes_a_sharded_random_model_that_loads(tmp_path, capsys):
    target = tmp_path / "model"
    shape = ["--layers", "3", "--experts", "4", "--top-k", "2", "--hidden", "64", "--intermediate", "32"]
    widths = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--vocab", "4096"]
    assert main(["make-checkpoint", str(target), *shape, *widths, "--layout", "hf", "--shard-gib", "0.0005"]) == 0
    checkpoint = Checkpoint(target)
    expected = tiny_config(experts=4, top_k=2, layers=3, vocab=4096)
    assert checkpoint.layout == "hf"
    assert checkpoint.config.num_hidden_layers == 3 and checkpoint.config.intermediate_size == 32
    assert checkpoint.config.vocab_size == expected.vocab_size and checkpoint.config.num_attention_heads == 4
    assert (target / "model.safetensors.index.json").is_file() and len(list(target.glob("*.safetensors"))) > 1
    out = capsys.readouterr()
    last = out.err.strip().splitlines()[-1]  # a pipe gets a line per tenth, ending at the total
    assert "its output is noise" in out.out and re.fullmatch(r"tensors: (\d+)/\1", last)

    assert main(["make-checkpoint", str(target)]) == 2  # not over an existing checkpoint
    assert "is not empty" in capsys.readouterr().err
    assert main(["make-checkpoint", str(tmp_path / "odd"), "--hidden", "33"]) == 2
    assert "hidden_size" in capsys.readouterr().err


def test_convert_builds_the_cached_graph_with_progress_and_names_bad_input(tmp_path, capsys):
    target = tmp_path / "model"
    assert main(["make-checkpoint", str(target), "--vocab", "2048"]) == 0
    capsys.readouterr()
    assert main(["convert", str(target), "--max-positions", "64", "--cache-dir", str(tmp_path / "graphs")]) == 0
    out = capsys.readouterr()
    built = out.out.strip()
    assert built.endswith("decoder.onnx") and (tmp_path / "graphs") in Path(built).parents
    assert f"layers: {DEMO_CONFIG.num_hidden_layers + 1}/{DEMO_CONFIG.num_hidden_layers + 1}" in out.err
    assert main(["convert", str(tmp_path / "absent")]) == 2
    assert "absent: not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert"])
    assert main(["convert", str(target), "--max-positions", "8"]) == 2
    assert "--max-positions" in capsys.readouterr().err
    graphs = ["--max-positions", "64", "--cache-dir", str(tmp_path / "graphs")]
    assert main(["convert", str(target), *graphs, "--dtype", "bfloat16"]) == 0
    assert "-bfloat16" in Path(capsys.readouterr().out.strip()).parent.name  # its own cache entry
    assert main(["convert", str(target), *graphs, "--page-size", "16"]) == 0
    assert "-g16-" in Path(capsys.readouterr().out.strip()).parent.name  # the backend's page_size: 16
    assert main(["convert", str(target), *graphs, "--page-size", "4"]) == 2
    assert "--page-size" in capsys.readouterr().err


def test_the_default_kind_is_the_engine_and_a_mock_script_alone_selects_the_mock(monkeypatch):
    monkeypatch.delenv("GATEWAY_BACKEND")
    assert Settings().backend_configs()["default"].kind == "onnx"
    scripted = Settings(mock_script="script.json").backend_configs()["default"]
    assert (scripted.kind, scripted.options["script"]) == ("mock", "script.json")
    assert Settings(mock_script="s.json", backend="vllm").backend_configs()["default"].kind == "vllm"
