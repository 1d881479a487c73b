#!/usr/bin/env bash
# On the GPU machine, in the working tree the device tool copied ($OUT set), after bench/device_prepare.sh's
# parts were sent: unpacks them once (the machine keeps /tmp while it stays warm), then runs one part of the
# engine's GPU check within one command's limit, writing under $OUT. The parts in the order of their value:
#
#   bash bench/device_run.sh check20b    parity, then gpt-oss-20b's shape (CUDA graphs)     ($OUT/20b)
#   bash bench/device_run.sh tests       pytest -m gpu                                        ($OUT/tests.log)
#   bash bench/device_run.sh kernels     the MoE kernel against the CPU's and QMoE; sampler  ($OUT/kernels)
#   bash bench/device_run.sh check120b   gpt-oss-120b's shape                                 ($OUT/120b)
#   bash bench/device_run.sh paged20b    512 x 2k sequences; a 131k prompt beside 64           ($OUT/paged)
#   bash bench/device_run.sh recheck20b  after a kernel change, in one command (about 8 minutes): the kernel
#                                        step, the attention step, the 20b shape (no QMoE model), pytest -m gpu,
#                                        parity, then paged20b
#   bash bench/device_run.sh attention20b  after an attention change, in about 4 minutes: the attention step
#                                        (prefill and decode on the tensor cores against the CUDA cores), the 20b
#                                        shape, paged20b, pytest -m gpu
#   bash bench/device_run.sh sweep       the MoE kernel's launch variants at every step size, 20b's and 120b's
#                                        layers (about 3 minutes; bench/moe_sweep.py), then the decode attention's
#                                        split by rows and context (about 1 minute; bench/attention_sweep.py):
#                                        $OUT/sweep/moe_tuning.json and attention_tuning.json, the tables the engine
#                                        reads; the parts run after it on this machine (it keeps /tmp while warm)
#                                        run with them. A window: sweep, then recheck20b.
#
# Back here: python bench/engine_check.py --render OUT/20b/engine_check.json OUT/kernels/engine_check.json \
#            OUT/120b/engine_check.json OUT/paged/engine_check.json OUT/sweep/engine_check.json
#            --docs docs/benchmarks.md, commit the JSON files as docs/engine_check*.json and the sweep's
#            moe_tuning.json and attention_tuning.json into backends/engine/kernels/.
set -uo pipefail
part=${1:?usage: device_run.sh check20b|tests|kernels|check120b|paged20b|recheck20b|attention20b|sweep}
out=${OUT:?the device tool sets OUT}
site=/tmp/gateway-site
if [ ! -f "$site/.installed" ]; then
  mkdir -p "$site" && tar -xJf /tmp/device-site.tar.xz -C "$site" && touch "$site/.installed" || exit 1
fi
export PYTHONPATH="$site:$PWD" GATEWAY_ENGINE_KERNELS="$site/libgptoss_engine_kernels.so" PYTHONUNBUFFERED=1
tuned=/tmp/tuned  # an earlier sweep on this machine: its tables in this copy of the tree
for table in moe_tuning.json attention_tuning.json; do
  if [ -f "$tuned/$table" ]; then cp "$tuned/$table" backends/engine/kernels/$table; fi
done
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
  df -h /tmp | tail -1
} 2>&1 | tee "$out/machine.txt"
check() {  # name, seconds, engine_check arguments: $OUT/name/engine_check.json (at most 8 files come back)
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" python3 bench/engine_check.py --device cuda --out "$out/$name" --work /tmp/engine-work "$@"
  rm -f "$out/$name/engine_check.md"  # rendered from the JSON back here
}
gpu_tests() {  # seconds
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/engine 2>&1 \
    | tail -40
}
{
case "$part" in
  check20b) check 20b 560 --cuda-graph --steps parity,scale ;;
  kernels) check kernels 560 --steps kernel,sampler ;;
  check120b)
    rm -rf /tmp/engine-work  # 20b's checkpoint and graphs: room for 120b's
    check 120b 560 --model 120b --steps scale ;;
  paged20b) check paged 560 --steps paged ;;
  tests) gpu_tests 560 ;;
  recheck20b)
    check kernels 110 --steps kernel
    check attention 90 --steps attention
    check 20b 150 --cuda-graph --no-qmoe-decode --steps scale
    gpu_tests 60
    check parity 60 --cuda-graph --steps parity
    check paged 100 --steps paged ;;
  attention20b)
    check attention 90 --steps attention
    check 20b 135 --cuda-graph --no-qmoe-decode --steps scale
    check paged 90 --steps paged
    gpu_tests 40 ;;
  sweep)
    check sweep 450 --steps sweep
    mkdir -p "$tuned"
    for table in moe_tuning.json attention_tuning.json; do
      if [ -f "$out/sweep/$table" ]; then cp "$out/sweep/$table" "$tuned/"; fi
    done ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
} 2>&1 | tee "$out/$part.log"
