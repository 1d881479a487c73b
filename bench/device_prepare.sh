#!/usr/bin/env bash
# Everything a GPU session's run (bench/device_run.sh) needs that the GPU machine lacks, made here (package
# registries, nvcc) before the device starts, so that its minutes go to measuring:
#
#   bash bench/device_prepare.sh          (in the checkout; PYTHON defaults to .venv/bin/python)
#
# .device/ (ignored; send it by naming it in `carry`, under 64 MiB): the kernel library built for any x86-64-v3
# CPU and sm_80/sm_90, and the cp312 wheels of the project's and the tests' dependencies, less numpy and onnx
# (the machine's torch image has them). .device-ort/ holds the onnxruntime-gpu wheel (about 250 MB, over one
# carry): the script then runs ../shared/tools/device_carry.sh on it, which prints one device command and one
# carry path per part; send those back to back, then `bash bench/device_run.sh check20b`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-.venv/bin/python}
exclude=$(git rev-parse --git-path info/exclude)
for ignored in /.device/ /.device-ort/; do grep -qxF "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >> "$exclude"; done
rm -rf .device .device-ort && mkdir -p .device/wheels .device-ort
"$python" - <<'PY'
import shutil
from pathlib import Path

from backends.engine.kernels.build import build_library

library = build_library(Path(".device/kernel-cache"), march="x86-64-v3")
manifest = (library.parent / "build.json").read_text()
assert '"cuda": true' in manifest, f"nvcc was not found: the library has no CUDA kernels ({manifest})"
shutil.copy(library, ".device/libgptoss_engine_kernels.so")
shutil.rmtree(".device/kernel-cache")
PY
platforms=()
for glibc in $(seq 39 -1 17); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
"$python" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
  -d .device/wheels . pytest hypothesis safetensors ml_dtypes "onnxruntime-gpu==1.31.1" 2>&1 | grep -v '^WARNING' || true
mv .device/wheels/onnxruntime_gpu-*.whl .device-ort/
rm -f .device/wheels/numpy-*.whl .device/wheels/onnx-*.whl .device/wheels/gpt_oss_gateway-*.whl
du -sh .device .device-ort
../shared/tools/device_carry.sh .device-ort/onnxruntime_gpu-*.whl
echo "# and with the first part's command, also carry .device"
