"""`gpt-oss-gateway serve-engine` processes for the tests and benches: the built-in engine alone, on a free
port, as an operator runs it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from server_process import ServerProcess

from backends.engine.kernels.build import KERNELS_ENV, build_library
from harmony import vocab


def tiny_engine_options(root: Path, **options: Any) -> dict[str, Any]:
    """The engine options of a tiny random model (the real vocabulary) written under `root`, its graph cached
    there, with `options` over the defaults."""
    from engine_fixtures import make_checkpoint, tiny_config

    checkpoint = make_checkpoint(root / "model", tiny_config(), "original")
    return {"checkpoint": str(checkpoint), "cache_dir": str(root / "cache"), **options}


class EngineServer(ServerProcess):
    def __init__(
        self, options: dict[str, Any], log_path: Path, api_key: str | None = None, port: int | None = None, **env: str
    ) -> None:
        """`port`: a given one (a server restarted on its address), else a free one."""
        args = [sys.executable, "-m", "gateway.cli", "serve-engine"]
        super().__init__(args, log_path, port=port)
        self.options = options
        self.api_key = api_key
        self.env = {
            **os.environ,
            vocab.DOWNLOAD_ENV: "0",
            KERNELS_ENV: str(build_library()),  # built once for the suite, not again per server
            "GATEWAY_ENGINE_PORT": str(self.port),
            "GATEWAY_ENGINE_OPTIONS": json.dumps(options),
            **({"GATEWAY_ENGINE_API_KEY": api_key} if api_key else {}),
            **env,
        }
