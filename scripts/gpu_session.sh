#!/usr/bin/env bash
# One device call's worth of GPU work (lead's harness). Run from the repo root on the GPU machine after
# onnxruntime-gpu was unpacked to /root/ortgpu. Stages (any subset, in order):
#   kernels   gpu tests of raggedvit.kernels (Triton JIT on the machine's Triton)
#   kbench    scripts/bench_kernel.py --check [--tune]
#   ort       scripts/gpu_ort_checks.sh (CUDA EP tests, 1000-call fuzz, compute-sanitizer memcheck)
#   memcheck  compute-sanitizer memcheck over scripts/memcheck_ort_fuzz.py (torch-free, our kernels only)
#   opbench   scripts/bench_ort_op.py (RaggedAttention vs PackedMultiHeadAttention inside ORT graphs)
#   e2e       scripts/bench_e2e.py (end-to-end pruned ViT benchmark)
#   graph     scripts/check_cuda_graph.py (CUDA-graph replay of a static-shape export == per-node run)
#   validate  fp16 CUDA-EP exports of deit_base_patch16_224 through `raggedvit validate --device cuda`
#   vckpt     the same from a checkpoint with random biases / norm shifts (scripts/perturbed_checkpoint.py), CKDTYPES
#   speed     benchmarks.traced_vs_builder: traced exports vs the graph builder's (source tarball $BUILDER_TGZ)
#   wheel     the wheel in dist/ installed outside the tree: info, export, validate --device cuda, bench --cuda-graph
#   mutants   the mutation suite on fp16 / fp16-all CUDA-EP exports (tests/validators/test_mutations.py -m gpu)
# Everything lands in /tmp/res, packed into $OUT/res.tgz (the device returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/ortgpu:$PWD${PYTHONPATH:+:$PYTHONPATH}
RES=/tmp/res; rm -rf "$RES"; mkdir -p "$RES"
KB_FLAGS=${KB_FLAGS:---check}
pack() { tar czf "$OUT/res.tgz" -C "$RES" . 2>/dev/null; }
# validate_exports PREFIX "DTYPES" LOG WEIGHT_ARGS...: export deit_base_patch16_224 with WEIGHT_ARGS for each dtype and
# both issue policies, then `raggedvit validate --device cuda` each into $RES/validate_PREFIX_<dtype>_<policy>.*
validate_exports() {
  local prefix=$1 dtypes=$2 log=$3 bad=0 dt pol name; shift 3
  local pids=()
  for dt in $dtypes; do
  for pol in "topk-l2 --keep 0.5 --prune-at 4" "cls-mass --mass 0.9 --prune-at 3,6,9"; do
    name=${prefix}_${dt}_${pol%% *}
    (OMP_NUM_THREADS=4 timeout 400 python3 -m raggedvit.cli export deit_base_patch16_224 "$@" --dtype $dt --policy $pol \
      -o /tmp/$name.onnx > "$RES/$name.log" 2>&1 &&
     OMP_NUM_THREADS=4 timeout 400 python3 -m raggedvit.cli validate /tmp/$name.onnx --device cuda --sample-images \
      --report "$RES/validate_$name" >> "$RES/$name.log" 2>&1) &
    pids+=($!)
  done
  done
  for p in "${pids[@]}"; do wait $p || bad=1; done
  cat "$RES"/${prefix}_*.log >> "$log"
  return $bad
}
trap pack EXIT
{ nvidia-smi; python3 -c "import torch, triton, onnxruntime as o; print(torch.__version__, triton.__version__, o.__version__, o.get_available_providers())"; } > "$RES/env.txt" 2>&1
cat "$RES/env.txt" | tail -3
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    kernels) timeout ${KT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider ${KTESTS:-tests/kernels} > "$RES/kernels_gpu.log" 2>&1; rc=$?; tail -3 "$RES/kernels_gpu.log";;
    kbench) timeout 300 python3 scripts/bench_kernel.py $KB_FLAGS --out "$RES" > "$RES/kbench.log" 2>&1; rc=$?; tail -45 "$RES/kbench.log";;
    ort) OUT="$RES/ort" timeout 300 bash scripts/gpu_ort_checks.sh 1000 > "$RES/ort.log" 2>&1; rc=$?; tail -8 "$RES/ort.log";;
    opbench) timeout 200 python3 scripts/bench_ort_op.py --out "$RES" > "$RES/opbench.log" 2>&1; rc=$?; tail -25 "$RES/opbench.log";;
    graph) timeout ${GT:-120} python3 scripts/check_cuda_graph.py --out "$RES" > "$RES/graph.log" 2>&1; rc=$?; tail -6 "$RES/graph.log";;
    e2e) timeout ${ET:-420} python3 scripts/bench_e2e.py --out "$RES" ${E2E_FLAGS:-} > "$RES/e2e.log" 2>&1; rc=$?; tail -40 "$RES/e2e.log";;
    validate)  # issue 5/6: fp16 CUDA-EP exports of deit_base pass `raggedvit validate --device cuda`
      rc=0; validate_exports deit_base "${VDTYPES:-fp16}" "$RES/validate.log" --seed 0 || rc=1
      grep -E "PASS|FAIL|max" "$RES/validate.log" | tail -8;;
    vckpt)  # seeded weights have zero biases: validate exports of a checkpoint that has them all
      rc=0
      timeout 120 python3 scripts/perturbed_checkpoint.py deit_base_patch16_224 /tmp/pb.safetensors >> "$RES/vckpt.log" 2>&1 || rc=1
      validate_exports deit_base_biased "${CKDTYPES:-fp32 fp16-all}" "$RES/vckpt.log" --checkpoint /tmp/pb.safetensors || rc=1
      grep -E "raggedvit validation|^\| 7 " "$RES/vckpt.log" | tail -8;;
    mutants)  # issue 14: every mutant must fail the fp16 rule on the CUDA EP, naming the images
      timeout ${MUT:-500} python3 -m pytest -q -m gpu -p no:cacheprovider -rxX tests/validators/test_mutations.py \
        > "$RES/mutants_gpu.log" 2>&1; rc=$?; tail -12 "$RES/mutants_gpu.log";;
    memcheck)  # issue 3: compute-sanitizer memcheck over >= 1000 fuzzed CUDA-EP calls (torch-free harness)
      timeout ${MT:-150} compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 --kernel-name kns=_ragged \
        --log-file "$RES/memcheck.log" python3 scripts/memcheck_ort_fuzz.py --calls ${MCALLS:-1000} \
        > "$RES/memcheck_fuzz.log" 2>&1; rc=$?
      grep -v "No registered" "$RES/memcheck_fuzz.log" | tail -4; grep -h "ERROR SUMMARY" "$RES/memcheck.log" | tail -1;;
    speed)  # issue 11: traced exports keep >= 0.97x the hand-built graph's img/s
      rm -rf /tmp/builder && mkdir -p /tmp/builder && tar xzf "${BUILDER_TGZ:-.device/builder.tgz}" -C /tmp/builder &&
        cp raggedvit/custom_ops/libraggedvit_ort.so /tmp/builder/raggedvit/custom_ops/
      timeout ${ST:-400} python3 -m benchmarks.traced_vs_builder --builder-src /tmp/builder \
        --out "$RES/traced_vs_builder.json" ${SPEED_FLAGS:-} > "$RES/speed.log" 2>&1; rc=$?; tail -30 "$RES/speed.log";;
    wheel)  # issue 15: the wheel built on the CPU machine (carried in dist/) installs and runs on the GPU
      rc=0; W=$(ls "$PWD"/dist/raggedvit-*.whl | head -1)
      ( set -e; python3 -m pip install -q --no-deps --no-index --force-reinstall --target /tmp/wheel "$W"
        cd /tmp && export PYTHONPATH=/tmp/wheel:/root/ortgpu${PYTHONPATH:+:$PYTHONPATH}
        python3 -c "import raggedvit; print('raggedvit from', raggedvit.__file__)"
        python3 -m raggedvit.cli info
        python3 -m raggedvit.cli export deit_tiny_patch16_224 --seed 0 --policy topk-l2 --prune-at 4 --dtype fp16-all -o /tmp/w.onnx
        python3 -m raggedvit.cli validate /tmp/w.onnx --device cuda --sample-images --report "$RES/wheel_validate"
        python3 -c "from raggedvit.runtime import create_session as c; c('/tmp/w.onnx', 'cuda', disable_cpu_fallback=True, batch=4); print('every node on the CUDA EP (CPU fallback disabled)')"
        python3 -m raggedvit.cli bench /tmp/w.onnx --device cuda --cuda-graph --batch 1,32 --json "$RES/wheel_bench.json"
      ) > "$RES/wheel.log" 2>&1 || rc=1; tail -12 "$RES/wheel.log";;
    *) echo "unknown stage $stage"; rc=2;;
  esac
  echo "### stage $stage rc=$rc $(( $(date +%s) - t0 ))s"
done
