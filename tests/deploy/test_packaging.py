"""What the container image is made of: the wheel alone serves (no source tree), and the Dockerfile copies
every package, installs extras that exist and runs as a non-root user."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from live_gateway import GatewayProcess
from paths import ROOT

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


def _wheel(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next(wheels.glob("gpt_oss_gateway-*.whl"))


def _installed(wheel: Path, site: Path) -> Path:
    """The wheel alone (no dependencies) installed into `site`."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


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
        built = [line for line in stages[build] if "build-kernels" in line]  # every CPU variant, chosen at load
        assert any("--variants" in line and "--output /opt/gateway/kernels" in line for line in built)
    runtime = stages["runtime"]
    assert any("GATEWAY_ENGINE_KERNELS=/opt/gateway/kernels" in line.split() for line in runtime)
    assert next(line.split()[1] for line in runtime if line.startswith("USER ")) == "10001:10001"
    assert runtime[-2:] == ['ENTRYPOINT ["gpt-oss-gateway"]', 'CMD ["serve"]']
    for image, build in (("cpu", "build-cpu"), ("cuda", "build-cuda")):
        assert stages[image][0] == f"FROM runtime AS {image}"
        assert f"COPY --from={build} /opt/gateway /opt/gateway" in stages[image]
        assert not any(line.startswith("USER ") for line in stages[image])  # stays 10001


def test_the_wheel_alone_serves(tmp_path):
    """The image installs the wheel, not the source tree: everything the gateway reads must be in it."""
    site = _installed(_wheel(tmp_path), tmp_path / "site")
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


ENGINE_RUNTIME = ("onnx", "onnxruntime", "onnxruntime_gpu", "safetensors", "ml_dtypes")


def test_without_the_engine_extra_the_gateway_serves_a_model_server_and_says_what_the_engine_needs(tmp_path):
    """`pip install gpt-oss-gateway` (no extra) asks for no engine runtime; with the wheel and its base
    dependencies only (this venv's packages less the engine's), `serve` runs the mock, and the default
    engine backend and the engine commands each stop with one line naming the extra."""
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    for line in requires:
        name = re.split(r"[ ;<>=~!\[]", line.removeprefix("Requires-Dist:").strip())[0].lower().replace("-", "_")
        if name in ENGINE_RUNTIME:
            assert 'extra == "engine"' in line or 'extra == "cuda"' in line, line
    site = _installed(wheel, tmp_path / "site")
    base = tmp_path / "base-deps"  # this venv's site-packages without the engine runtime (nor the editable gateway)
    base.mkdir()
    venv_site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    for entry in venv_site.iterdir():
        stem = entry.name.split("-")[0].lower().split(".")[0]
        if stem not in ENGINE_RUNTIME and not entry.name.startswith(("gpt_oss_gateway", "__editable__", "_gpt_oss")):
            (base / entry.name).symlink_to(entry)
    python = [sys.executable, "-S"]  # no site: only PYTHONPATH's directories
    env = {"PYTHONPATH": f"{site}:{base}", "PYTHONSAFEPATH": "1", "GATEWAY_VOCAB_DOWNLOAD": "0"}
    probe = subprocess.run([*python, "-c", "import onnxruntime"], env={**os.environ, **env}, capture_output=True)
    assert probe.returncode != 0  # the engine runtime is really out of reach
    mock = GatewayProcess({**env, "GATEWAY_BACKEND": "mock"}, tmp_path / "mock.log", cwd=tmp_path, python_flags=("-S",))
    mock.start()  # waits for /readyz: 200
    mock.stop()
    for argv in (["serve"], ["convert", "--help"]):
        done = subprocess.run(
            [*python, "-m", "gateway.cli", *argv],
            env={**os.environ, **env, "GATEWAY_PORT": "0", "GATEWAY_BACKEND": "onnx"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and "pip install 'gpt-oss-gateway[engine]'" in lines[-1], done.stderr
