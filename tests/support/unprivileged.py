"""A gateway as the image runs it: uid 10001 (setpriv), on the system interpreter with this checkout's packages
(readable by every user), optionally on a host without user namespaces (bubblewrap's --disable-userns)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_gateway import GatewayProcess

UNPRIVILEGED = ("setpriv", "--reuid", "10001", "--regid", "10001", "--clear-groups")
NO_USER_NAMESPACES = (
    "bwrap",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--bind",
    "/",
    "/",
    "--dev-bind",
    "/dev",
    "/dev",
)
SYSTEM_PYTHON = "/usr/bin/python3"
CHECKOUT = Path(__file__).resolve().parents[2]


def require_unprivileged_gateway() -> None:
    """Skip unless a gateway can be started as uid 10001 here."""
    import os

    if os.getuid() != 0 or not shutil.which("setpriv") or not Path(SYSTEM_PYTHON).exists():
        pytest.skip("needs root to start a gateway as uid 10001, setpriv and the system python")
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True)
    if tuple(int(part) for part in found.stdout.split()) != tuple(int(p) for p in platform.python_version_tuple()[:2]):
        pytest.skip("the system python cannot load this environment's compiled packages")
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    probe = [*UNPRIVILEGED, "env", f"PYTHONPATH={CHECKOUT}:{site}", SYSTEM_PYTHON, "-c", "import gateway.app"]
    if subprocess.run(probe, capture_output=True, cwd="/").returncode != 0:
        pytest.skip(f"uid 10001 cannot read this checkout ({CHECKOUT}) or its virtual environment")


def unprivileged_gateway(directory: Path, env: dict[str, str], no_user_namespaces: bool = False) -> GatewayProcess:
    """Started (ready) with `env`; its log is `directory`/gateway.log."""
    require_unprivileged_gateway()
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    launcher = UNPRIVILEGED + ((*NO_USER_NAMESPACES, "--") if no_user_namespaces else ())
    env = {"PYTHONPATH": f"{CHECKOUT}:{site}", "HOME": str(directory), **env}
    return GatewayProcess(env, directory / "gateway.log", cwd=Path("/"), launcher=launcher, python=SYSTEM_PYTHON)


def write_readable(path: Path, payload: object) -> Path:
    path.write_text(json.dumps(payload))
    path.chmod(0o644)
    return path


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory uid 10001 can read (pytest's own are root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="gw-unprivileged-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
