"""A model server as a process of its own, on a free port, as an operator runs it: started, waited for on its
health endpoint, scraped, killed or stopped (the engine's servers, llama.cpp's)."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from redis_servers import free_port


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None, port: int | None = None):
        """`args` and `env` may name `self.port` (the given one, or a free one) once the subclass has it."""
        self.port = port or free_port()
        self.args = args
        self.env = env
        self._log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> ServerProcess:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> ServerProcess:
        """The process started (several load their models side by side); `wait_ready` waits for it."""
        with self._log_path.open("ab") as log:
            self.process = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=log)
        return self

    def wait_ready(self, timeout_s: float = 300) -> ServerProcess:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.args[0]} exited: {self.log_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.args[0]} did not become ready")
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
