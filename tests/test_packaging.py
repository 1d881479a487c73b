"""What the container image is made of: the wheel alone serves (no source tree), and the Dockerfile copies
every package, installs extras that exist and runs as a non-root user."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from live_gateway import GatewayProcess

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _stages() -> dict[str, list[str]]:
    """Dockerfile instructions (continuation lines joined) by stage name."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = re.match(r"FROM \S+ AS (\S+)$", line)
        if found:
            current = stages.setdefault(found.group(1), [])
        current.append(line)
    return stages


def test_the_dockerfile_builds_both_variants_from_every_package_as_non_root():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {name.rstrip("*") for name in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    extras = set(project["project"]["optional-dependencies"])
    stages = _stages()
    assert {"build-cpu", "build-cuda", "runtime", "cpu", "cuda"} <= stages.keys()
    copied = {line.split()[1] for line in stages["build-cpu"] if line.startswith("COPY ")}
    assert packages <= copied, f"the build does not copy {packages - copied}"
    assert all((ROOT / path).exists() for path in copied)
    installs = " ".join(stages["build-cpu"] + stages["build-cuda"])
    for extra in re.findall(r"'\.\[([a-z,]+)\]'", installs):
        assert set(extra.split(",")) <= extras
    for build in ("build-cpu", "build-cuda"):  # kernels built into the venv the images copy, named by the runtime
        assert any("build-kernels" in line and "--output /opt/gateway/kernels" in line for line in stages[build])
    runtime = stages["runtime"]
    assert any("GATEWAY_ENGINE_KERNELS=/opt/gateway/kernels/libgptoss_engine_kernels.so" in line for line in runtime)
    assert next(line.split()[1] for line in runtime if line.startswith("USER ")) == "10001:10001"
    assert runtime[-2:] == ['ENTRYPOINT ["gpt-oss-gateway"]', 'CMD ["serve"]']
    for image, build in (("cpu", "build-cpu"), ("cuda", "build-cuda")):
        assert stages[image][0] == f"FROM runtime AS {image}"
        assert f"COPY --from={build} /opt/gateway /opt/gateway" in stages[image]
        assert not any(line.startswith("USER ") for line in stages[image])  # stays 10001


def test_the_wheel_alone_serves(tmp_path):
    """The image installs the wheel, not the source tree: everything the gateway reads must be in it."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = tmp_path / "site"
    wheel = next(wheels.glob("gpt_oss_gateway-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import gateway, harmony; print(gateway.__file__, harmony.__file__)"],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where
    gateway = GatewayProcess(env, tmp_path / "gateway.log", cwd=tmp_path).start()  # waits for /readyz: 200
    gateway.stop()
