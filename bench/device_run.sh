#!/usr/bin/env bash
# On the GPU machine, in the working tree the device tool copied ($OUT set), after bench/device_prepare.sh's
# parts were sent: installs them once (the machine keeps /tmp while it stays warm), then runs one part of the
# engine's GPU check within one command's limit, writing under $OUT.
#
#   bash bench/device_run.sh check20b    parity, kernel, sampler, then gpt-oss-20b's shape   ($OUT/20b)
#   bash bench/device_run.sh check120b   gpt-oss-120b's shape                                 ($OUT/120b)
#   bash bench/device_run.sh paged20b    512 x 2k sequences; a 131k prompt beside 64           ($OUT/paged)
#   bash bench/device_run.sh tests       pytest -m gpu                                        ($OUT/tests.txt)
#
# Back here: python bench/engine_check.py --render OUT/20b/engine_check.json OUT/120b/engine_check.json \
#            OUT/paged/engine_check.json
#            --docs docs/benchmarks.md, and commit the JSON files as docs/engine_check*.json.
set -uo pipefail
part=${1:?usage: device_run.sh check20b|check120b|paged20b|tests}
out=${OUT:?the device tool sets OUT}
site=/tmp/gateway-site
if [ ! -f "$site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$site" .carry-assembled/onnxruntime_gpu-*.whl \
    .device/wheels/*.whl && touch "$site/.installed"
fi
export PYTHONPATH="$site:$PWD" GATEWAY_ENGINE_KERNELS="$PWD/.device/libgptoss_engine_kernels.so"
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
  df -h /tmp | tail -1
} 2>&1 | tee "$out/machine.txt"
case "$part" in
  check20b) timeout 560 python3 bench/engine_check.py --device cuda --out "$out/20b" --work /tmp/engine-work --cuda-graph ;;
  check120b)
    rm -rf /tmp/engine-work  # 20b's checkpoint and graphs: room for 120b's
    timeout 560 python3 bench/engine_check.py --device cuda --out "$out/120b" --work /tmp/engine-work --model 120b \
      --steps scale ;;
  paged20b) timeout 560 python3 bench/engine_check.py --device cuda --out "$out/paged" --work /tmp/engine-work \
      --steps paged ;;
  tests) timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine 2>&1 | tail -40 | tee "$out/tests.txt" ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
