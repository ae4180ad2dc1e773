#!/usr/bin/env bash
# One-shot GPU checks of the ORT op library (CUDA EP), run on the GPU machine (from any folder) with
# raggedvit/custom_ops/libraggedvit_ort.so built elsewhere and carried over:
#
#     OUT=/some/dir bash scripts/gpu_ort_checks.sh [FUZZ_CALLS]
#     STEPS="memcheck" OUT=... bash scripts/gpu_ort_checks.sh    # a subset of: tests fuzz memcheck
#
# Paths, from the environment (default in brackets):
#   OUT                logs, JSON and the summary [benchmarks/results/gpu_ort_checks, from the repo root]
#   ORT_GPU_DIR        onnxruntime-gpu unpacked here goes first on PYTHONPATH [empty: the ORT already importable]
#   COMPUTE_SANITIZER  the compute-sanitizer binary [PATH, then /usr/local/cuda*/bin and the Python site-packages]
#   MEMCHECK_TIMEOUT   seconds for the sanitized fuzz [200]
#
# 1. gpu-marked tests of tests/custom_ops and tests/test_runtime.py (CUDA EP vs reference, no CPU fallback)
# 2. fuzz: FUZZ_CALLS (default 1000) CUDA-EP calls with valid and invalid cu_seqlens
# 3. the same fuzz under `compute-sanitizer --tool memcheck`, asserting 0 errors
# Logs and JSON land in $OUT (default benchmarks/results/gpu_ort_checks); a summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_ort_checks}
CALLS=${1:-1000}
STEPS=${STEPS:-tests fuzz memcheck}
mkdir -p "$OUT"
ORT_GPU_DIR=${ORT_GPU_DIR:-}
export PYTHONUNBUFFERED=1 PYTHONPATH="${ORT_GPU_DIR:+$ORT_GPU_DIR:}${PYTHONPATH:+$PYTHONPATH:}$PWD"
declare -A STATUS

echo "== environment" | tee "$OUT/env.txt"
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv 2>&1
  python3 -c "import onnxruntime as o, torch, json; print('onnxruntime', o.__version__, o.get_available_providers()); print('torch', torch.__version__, torch.cuda.is_available())"
  python3 -c "import json; from raggedvit.custom_ops import library_info as i; d = i(); d['build'].pop('configs'); print(json.dumps(d))"
} 2>&1 | tee -a "$OUT/env.txt"

for k in gpu_tests fuzz memcheck; do STATUS[$k]="skipped (STEPS)"; done

if [[ " $STEPS " == *" tests "* ]]; then
echo "== 1. gpu tests"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/custom_ops tests/test_runtime.py \
  --junitxml="$OUT/pytest_gpu.xml" 2>&1 | tee "$OUT/pytest_gpu.log"
rc=${PIPESTATUS[0]}
line=$(tail -1 "$OUT/pytest_gpu.log")
if [ "$rc" -eq 0 ] && echo "$line" | grep -q " passed"; then STATUS[gpu_tests]="PASS ($line)"
else STATUS[gpu_tests]="FAIL (rc=$rc: $line)"; fi
fi

if [[ " $STEPS " == *" fuzz "* ]]; then
echo "== 2. fuzz ($CALLS calls)"
python3 scripts/fuzz_ort_cuda.py --calls "$CALLS" --out "$OUT/fuzz" 2>&1 | tee "$OUT/fuzz.log"
STATUS[fuzz]=$([ "${PIPESTATUS[0]}" -eq 0 ] && echo PASS || echo FAIL)
fi

if [[ " $STEPS " == *" memcheck "* ]]; then
echo "== 3. compute-sanitizer memcheck over the fuzz ($CALLS calls)"
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
if [ -z "$SAN" ]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           $(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null); do
    if [ -d "$c" ]; then c=$(find "$c" -path '*compute-sanitizer*' -name compute-sanitizer -type f 2>/dev/null | head -1); fi
    if [ -n "$c" ] && [ -x "$c" ]; then SAN=$c; break; fi
  done
fi
if [ -z "$SAN" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)" | tee "$OUT/memcheck.log"
  STATUS[memcheck]="NOT RUN (no compute-sanitizer)"
else
  echo "using $SAN"
  # exact-size torch allocations, so out-of-bounds accesses to qkv/cu/out/cls_attn are caught
  # instrument only our kernels (cuBLAS/torch kernels run uninstrumented): memcheck over every kernel of the
  # process did not finish 1000 calls in 300 s on the H200
  FILTER=()
  if "$SAN" --help 2>&1 | grep -q -- "--kernel-name"; then FILTER=(--kernel-name kns=_ragged); fi
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-200}" "$SAN" --tool memcheck --leak-check no \
    --error-exitcode 99 "${FILTER[@]}" --log-file "$OUT/memcheck.log" \
    python3 scripts/fuzz_ort_cuda.py --calls "$CALLS" --max-t 400 --out "$OUT/fuzz_memcheck" 2>&1 | tee "$OUT/fuzz_memcheck.log"
  rc=${PIPESTATUS[0]}
  summary=$(grep -h "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1)
  echo "memcheck: rc=$rc ${summary:-no ERROR SUMMARY line}"
  if [ "$rc" -eq 0 ] && echo "$summary" | grep -q "ERROR SUMMARY: 0 errors"; then
    STATUS[memcheck]="PASS ($summary)"
  else
    STATUS[memcheck]="FAIL (rc=$rc; ${summary:-see memcheck.log})"
  fi
fi
fi

echo
echo "== summary ($OUT)"
printf '%-12s %s\n' check result
for k in gpu_tests fuzz memcheck; do printf '%-12s %s\n' "$k" "${STATUS[$k]}"; done | tee "$OUT/summary.txt"
grep -q FAIL "$OUT/summary.txt" && exit 1
exit 0
