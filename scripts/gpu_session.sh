#!/usr/bin/env bash
# One device call's worth of GPU work (lead's harness). Run from the repo root on the GPU machine after
# onnxruntime-gpu was unpacked to /root/ortgpu. Stages (any subset, in order):
#   kernels   gpu tests of raggedvit.kernels (Triton JIT on the machine's Triton)
#   kbench    scripts/bench_kernel.py --check [--tune]
#   ort       scripts/gpu_ort_checks.sh (CUDA EP tests, 1000-call fuzz, compute-sanitizer memcheck)
#   opbench   scripts/bench_ort_op.py (RaggedAttention vs PackedMultiHeadAttention inside ORT graphs)
#   e2e       scripts/bench_e2e.py (end-to-end pruned ViT benchmark) + cuda validation
# Everything lands in /tmp/res, packed into $OUT/res.tgz (the device returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/ortgpu:$PWD
RES=/tmp/res; rm -rf "$RES"; mkdir -p "$RES"
KB_FLAGS=${KB_FLAGS:---check}
pack() { tar czf "$OUT/res.tgz" -C "$RES" . 2>/dev/null; }
trap pack EXIT
{ nvidia-smi; python3 -c "import torch, triton, onnxruntime as o; print(torch.__version__, triton.__version__, o.__version__, o.get_available_providers())"; } > "$RES/env.txt" 2>&1
cat "$RES/env.txt" | tail -3
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    kernels) timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/kernels > "$RES/kernels_gpu.log" 2>&1; rc=$?; tail -3 "$RES/kernels_gpu.log";;
    kbench) timeout 300 python3 scripts/bench_kernel.py $KB_FLAGS --out "$RES" > "$RES/kbench.log" 2>&1; rc=$?; tail -45 "$RES/kbench.log";;
    ort) OUT="$RES/ort" timeout 300 bash scripts/gpu_ort_checks.sh 1000 > "$RES/ort.log" 2>&1; rc=$?; tail -8 "$RES/ort.log";;
    opbench) timeout 200 python3 scripts/bench_ort_op.py --out "$RES" > "$RES/opbench.log" 2>&1; rc=$?; tail -25 "$RES/opbench.log";;
    e2e) timeout 420 python3 scripts/bench_e2e.py --out "$RES" ${E2E_FLAGS:-} > "$RES/e2e.log" 2>&1; rc=$?; tail -40 "$RES/e2e.log";;
    *) echo "unknown stage $stage"; rc=2;;
  esac
  echo "### stage $stage rc=$rc $(( $(date +%s) - t0 ))s"
done
