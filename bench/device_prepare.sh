#!/usr/bin/env bash
# Everything a GPU session's run (bench/device_run.sh) needs that the GPU machine lacks, made here (package
# registries, nvcc) before the device starts, so that its minutes go to measuring:
#
#   bash bench/device_prepare.sh          (in the checkout; PYTHON defaults to .venv/bin/python)
#
# One archive, .device/device-site.tar.xz (ignored): a site directory holding onnxruntime-gpu (less what the
# engine never loads: the TensorRT provider and the Python tools), the project's and the tests' dependencies (the
# MCP extra, openai and uvicorn for the engine tests that drive a gateway) built for cp312 (less numpy and onnx:
# the machine's torch image has them), and the kernel library built for
# any x86-64-v3 CPU and sm_80/sm_90, split into parts under .carry/ that fit one transfer beside the working
# tree. It prints one device command and one carry path per part: send them back to back (each appends its
# part to /tmp on the machine, which it keeps while warm; an ignored folder of the working tree did not stay
# between calls), the last one followed by `bash bench/device_run.sh recheck20b` (the whole check in one command).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-.venv/bin/python}
part_mb=${PART_MB:-59}  # plus the working tree (~3 MB): under one transfer's 64 MiB
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF /.device/ "$exclude" 2>/dev/null || echo /.device/ >> "$exclude"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf .device && mkdir -p .device "$stage/wheels" "$stage/site"
"$python" - "$stage/site" <<'PY'
import shutil
import sys
from pathlib import Path

from backends.engine.kernels.build import build_library

library = build_library(Path(sys.argv[1]).parent / "kernel-cache", march="x86-64-v3")
manifest = (library.parent / "build.json").read_text()
assert '"cuda": true' in manifest, f"nvcc was not found: the library has no CUDA kernels ({manifest})"
shutil.copy(library, Path(sys.argv[1]) / "libgptoss_engine_kernels.so")
PY
platforms=()
for glibc in $(seq 39 -1 17); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
"$python" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
  -d "$stage/wheels" ".[mcp]" pytest hypothesis openai uvicorn safetensors ml_dtypes "onnxruntime-gpu==1.31.1" 2>&1 | grep -v '^WARNING' || true
rm -f "$stage"/wheels/numpy-*.whl "$stage"/wheels/onnx-*.whl "$stage"/wheels/gpt_oss_gateway-*.whl
"$python" -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 --target "$stage/site" "$stage"/wheels/*.whl 2>&1 \
  | grep -v '^WARNING' || true
ort="$stage/site/onnxruntime"
test -f "$ort/capi/libonnxruntime_providers_cuda.so" || { echo "onnxruntime-gpu is missing" >&2; exit 1; }
rm -rf "$ort/capi/libonnxruntime_providers_tensorrt.so" "$ort/tools" "$ort/transformers" "$ort/quantization" \
  "$stage/site/bin"
tar -C "$stage/site" -cf - . | xz -T0 -6 > .device/device-site.tar.xz
du -sh "$stage/site" .device/device-site.tar.xz
exclude_carry=/.carry/
grep -qxF "$exclude_carry" "$exclude" || echo "$exclude_carry" >> "$exclude"
rm -rf .carry && mkdir -p .carry
split -b "${part_mb}M" -d -a 2 .device/device-site.tar.xz .carry/device-site.part-
sum=$(sha256sum .device/device-site.tar.xz | cut -d' ' -f1)
parts=(.carry/device-site.part-*)
echo "# ${#parts[@]} parts; sha256 $sum"
for part in "${parts[@]}"; do
  redirect='>>'
  [ "$part" = "${parts[0]}" ] && redirect='>'
  echo "carry $part; command: cat $part $redirect /tmp/device-site.partial && ls -l /tmp/device-site.partial"
done
echo "last part's command, then: echo '$sum  /tmp/device-site.partial' | sha256sum -c - &&" \
  "mv /tmp/device-site.partial /tmp/device-site.tar.xz && bash bench/device_run.sh recheck20b"
