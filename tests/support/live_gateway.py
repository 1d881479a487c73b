"""A real gateway on 127.0.0.1 for SDK tests: in this process (a server thread) or as a `serve` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from redis_servers import free_port
from threaded_server import ThreadedServer

from backends.base import Capabilities, Chunk
from backends.mock import MockBackend
from gateway.app import create_app
from gateway.config import Settings
from gateway.services import SERVICES, Services
from harmony import vocab


class LiveGateway:
    """The aiohttp app served by a private event loop in a thread; `backend` is its mock backend."""

    def __init__(self, settings: Settings, backend: Any | None = None) -> None:
        self._backend_override = backend
        self._server = ThreadedServer()
        self.port = self._server.port
        self.settings = settings.model_copy(update={"port": self.port})
        self.services: Services | None = None

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def backend(self) -> MockBackend:
        assert self.services is not None
        backend = next(iter(self.services.backends.values()))
        assert isinstance(backend, MockBackend)
        return backend

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the gateway's loop (e.g. to reach its store) and wait for it."""
        return self._server.call(coroutine, timeout)

    def wait_until_ready(self, model: str, timeout_s: float = 120) -> None:
        """Until `model`'s backend can take requests (the built-in engine loads in the background)."""
        deadline = time.monotonic() + timeout_s
        while not self.call(self.services.backends[model].ready()):
            assert time.monotonic() < deadline, f"the backend of {model} did not become ready"
            time.sleep(0.05)

    def start(self) -> LiveGateway:
        def make_app() -> web.Application:
            app = create_app(self.settings)
            self.services = app[SERVICES]
            if self._backend_override is not None:
                self.services.backends = {model: self._backend_override for model in self.services.backends}
            return app

        self._server.serve(make_app, handle_signals=False)
        return self

    def stop(self, timeout: float = 30) -> None:
        self._server.close(timeout)


class GatewayProcess:
    """`python -m gateway.cli serve` (or `command`) with the given environment, as an operator runs it."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        cwd: Path | None = None,
        unset: tuple[str, ...] = (),
        port: int | None = None,
        python_flags: tuple[str, ...] = (),  # e.g. -S: only PYTHONPATH's packages
        launcher: tuple[str, ...] = (),  # what runs the interpreter (e.g. another uid's setpriv)
        python: str = sys.executable,
        command: tuple[str, ...] = (),  # the command line instead (e.g. the installed `gpt-oss-gateway serve`)
    ) -> None:
        self.port = port or free_port()
        self._command = command
        self._python_flags = python_flags
        self._launcher = launcher
        self._python = python
        self._cwd = cwd
        self._env = {**os.environ, vocab.DOWNLOAD_ENV: "0", **env, "GATEWAY_PORT": str(self.port)}
        for name in unset:
            self._env.pop(name, None)
        self._log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30, *, ready: bool = True) -> GatewayProcess:
        """The process started, once /readyz answers 200 (or, with `ready=False`, once it answers at all)."""
        with self._log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self._command or [*self._launcher, self._python, *self._python_flags, "-m", "gateway.cli", "serve"],
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as response:
                    if response.status == 200:
                        return self
            except urllib.error.HTTPError:
                if not ready:
                    return self
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited: {self._log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()  # not left running past the test that gave up on it
                raise RuntimeError(f"gateway did not become ready in {timeout_s} s: {self.log_text()[-2000:]}")
            time.sleep(0.1)

    def log_text(self) -> str:
        return self._log_path.read_text(errors="replace")

    def json_lines_until(self, found: Callable[[list[dict]], bool], timeout_s: float = 10) -> list[dict]:
        """The log's JSON lines once `found(lines)` holds (the access log writes a request's line in an event-loop
        iteration after it, so it can follow the response the client already has), or at `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]
            if found(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class FailingBackend:
    """Emits the start of an answer, then fails as a remote server dropping the connection would."""

    def __init__(self, encoding) -> None:
        self.capabilities = Capabilities(context_length=4096)
        self._tokens = encoding.encode_marked("<|channel|>final<|message|>partial answer")

    async def generate(self, request):
        for token in self._tokens:
            yield Chunk([token])
        raise ConnectionError("upstream went away")

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None
