"""`gpt-oss-gateway serve-engine` processes for the tests and benches: the built-in engine alone, on a free
port, as an operator runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from redis_servers import free_port

from backends.engine.kernels.build import KERNELS_ENV, build_library
from harmony import vocab


def tiny_engine_options(root: Path, **options: Any) -> dict[str, Any]:
    """The engine options of a tiny random model (the real vocabulary) written under `root`, its graph cached
    there, with `options` over the defaults."""
    from engine_fixtures import make_checkpoint, tiny_config

    checkpoint = make_checkpoint(root / "model", tiny_config(), "original")
    return {"checkpoint": str(checkpoint), "cache_dir": str(root / "cache"), **options}


class EngineServer:
    def __init__(
        self, options: dict[str, Any], log_path: Path, api_key: str | None = None, port: int | None = None, **env: str
    ) -> None:
        """`port`: a given one (a server restarted on its address), else a free one."""
        self.options = options
        self.port = port or free_port()
        self.api_key = api_key
        self._log_path = log_path
        self._env = {
            **os.environ,
            vocab.DOWNLOAD_ENV: "0",
            KERNELS_ENV: str(build_library()),  # built once for the suite, not again per server
            "GATEWAY_ENGINE_PORT": str(self.port),
            "GATEWAY_ENGINE_OPTIONS": json.dumps(options),
            **({"GATEWAY_ENGINE_API_KEY": api_key} if api_key else {}),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> EngineServer:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> EngineServer:
        """The process started (several load their models side by side); `wait_ready` waits for it."""
        with self._log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve-engine"], env=self._env, stdout=log, stderr=log
            )
        return self

    def wait_ready(self, timeout_s: float = 300) -> EngineServer:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"engine server exited: {self.log_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("engine server did not become ready")
            time.sleep(0.1)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of its /metrics, by name."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def log_text(self) -> str:
        return self._log_path.read_text(errors="replace")

    def kill(self) -> None:
        """As a node lost: no drain, connections cut."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
