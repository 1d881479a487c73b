"""`gpt-oss-gateway serve` as a newcomer runs it: a real process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from redis_servers import free_port

from gateway import cli
from harmony import encoding as harmony_encoding
from harmony import vocab


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status, json.loads(resp.read())


def test_serve_answers_health_and_readiness():
    port = free_port()
    env = {**os.environ, "GATEWAY_PORT": str(port), vocab.DOWNLOAD_ENV: "0"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                assert proc.poll() is None, "gateway exited"
                assert time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.1)
        assert (status, body) == (200, {"status": "ok"})
        assert _get(f"http://127.0.0.1:{port}/readyz") == (
            200,
            {
                "status": "ready",
                "vocab_size": 201089,
                "store": "ok",
                "models": {"gpt-oss-120b": "ready", "gpt-oss-20b": "ready"},
            },
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_without_vocabulary_exits_with_the_attempts(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(vocab.DOWNLOAD_ENV, "0")
    monkeypatch.setattr(vocab, "packaged_copy", lambda: (_ for _ in ()).throw(OSError("missing")))
    harmony_encoding._load.cache_clear()
    try:
        assert cli.main(["serve", "--vocab-path", str(tmp_path / "nope.tiktoken")]) == 2
    finally:
        harmony_encoding._load.cache_clear()
    err = capsys.readouterr().err
    assert "could not load o200k_base.tiktoken" in err and "nope.tiktoken" in err


def test_cli_requires_a_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2


def test_a_replica_in_front_of_a_model_server_never_loads_the_engine_runtime(tmp_path):
    """Idle memory: `serve` with the mock maps no ONNX Runtime library (the engine's commands and backend
    import it only when used); the engine's commands still work."""
    from live_gateway import GatewayProcess

    gateway = GatewayProcess({"GATEWAY_BACKEND": "mock"}, tmp_path / "serve.log").start()
    try:
        maps = Path(f"/proc/{gateway.process.pid}/maps").read_text()
        assert "onnxruntime" not in maps and "libonnx" not in maps
    finally:
        gateway.stop()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "convert", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--dtype" in done.stdout
