#!/usr/bin/env bash
# One device call's worth of GPU work (lead's harness), run on the GPU machine (from any folder):
#
#     [ORT_GPU_DIR=/root/ortgpu] [RES=/tmp/res] [WORK=/tmp] [OUT=DIR] bash scripts/gpu_session.sh STAGE...
#
# Paths, from the environment (default in brackets):
#   ORT_GPU_DIR  onnxruntime-gpu unpacked here goes first on PYTHONPATH [/root/ortgpu; empty: the installed ORT]
#   RES          every log and result file; emptied first [/tmp/res]
#   OUT          RES packed into OUT/res.tgz at exit (the device returns at most 8 files) [unset: no tarball]
#   WORK         scratch: exports, the perturbed checkpoint, the builder tree, the wheel install [/tmp]
#   RAGGEDVIT_COMMIT  the commit the benchmarks record (benchmarks/env.py): set it in the device command, since the
#                device's copy of .git can still name an earlier commit than the tree it was sent
#   BUILDER_TGZ  source tarball of the graph-builder raggedvit for `speed` [.device/builder.tgz, from the repo root]
# Stages (any subset, in order):
#   kernels   gpu tests of raggedvit.kernels (Triton JIT on the machine's Triton)
#   kbench    python3 -m benchmarks.kernel --check [--tune] (KB_FLAGS)
#   ort       scripts/gpu_ort_checks.sh (CUDA EP tests, 1000-call fuzz, compute-sanitizer memcheck)
#   memcheck  compute-sanitizer memcheck over scripts/memcheck_ort_fuzz.py (MCALLS, MC_FLAGS: its other counts;
#             torch-free; only our kernels: each
#             --kernel-name filter adds kernels, kns= a substring of the name: _ragged*, _select_count/_scatter)
#   gelu      python3 -m benchmarks.gelu (bias + GELU kernels against a copy, torch and libdevice erf)
#   opbench   python3 -m benchmarks.ort_op (RaggedAttention vs PackedMultiHeadAttention inside ORT graphs)
#   e2e       python3 -m benchmarks.e2e (end-to-end pruned ViT benchmark, E2E_FLAGS)
#   graph     python3 -m benchmarks.check_cuda_graph (CUDA-graph replay of a static-shape export == per-node run;
#             GRAPH_POLICIES, GRAPH_FLAGS e.g. "--ragged-linear dead-rows")
#   validate  fp16 CUDA-EP exports of deit_base_patch16_224 through `raggedvit validate --device cuda`
#             (VCAP=1: cls-mass in the capacity layout; VRL=1: both with --ragged-linear; VRLB=dead-rows: cls-mass
#             with --ragged-linear-blocks dead-rows)
#   vckpt     the same from a checkpoint with random biases / norm shifts (scripts/perturbed_checkpoint.py), CKDTYPES
#   serving   python3 -m benchmarks.serving: timm eager, torch.compile, ORT CUDA graphs vs raggedvit (SERVING_FLAGS)
#   overhead  python3 -m benchmarks.graph_overhead: wall vs GPU span of CUDA-graph runs at B = 1, 4, 32 (OVH_FLAGS)
#   families  issue 12: an EVA02 and a BEiT export, topk-l2 vs the same model unpruned, ORT fp16 CUDA graphs
#   speed     python3 -m benchmarks.traced_vs_builder: traced exports vs the graph builder's (BUILDER_TGZ)
#   wheel     the wheel in dist/ installed outside the tree: info, export, validate --device cuda, bench --cuda-graph
#   mutants   the mutation suite on fp16 / fp16-all CUDA-EP exports (tests/validators/test_mutations.py -m gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
ORT_GPU_DIR=${ORT_GPU_DIR-/root/ortgpu}
RES=${RES:-/tmp/res}
WORK=${WORK:-/tmp}
BUILDER_TGZ=${BUILDER_TGZ:-.device/builder.tgz}
case $RES in /|"$HOME"|"$PWD") echo "RES=$RES would be emptied: give a folder of its own" >&2; exit 2;; esac
export PYTHONUNBUFFERED=1 PYTHONPATH=${ORT_GPU_DIR:+$ORT_GPU_DIR:}$PWD${PYTHONPATH:+:$PYTHONPATH}
rm -rf "$RES"; mkdir -p "$RES" "$WORK"
KB_FLAGS=${KB_FLAGS:---check}
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/res.tgz" -C "$RES" . 2>/dev/null; fi; }
# validate_exports PREFIX "DTYPES" LOG WEIGHT_ARGS...: export deit_base_patch16_224 with WEIGHT_ARGS for each dtype and
# both issue policies, then `raggedvit validate --device cuda` each into $RES/validate_PREFIX_<dtype>_<policy>.*
validate_exports() {
  local prefix=$1 dtypes=$2 log=$3 bad=0 dt pol name; shift 3
  local pids=()
  for dt in $dtypes; do
  for pol in "topk-l2 --keep 0.5 --prune-at 4${VRL:+ --ragged-linear}" \
             "cls-mass --mass 0.9 --prune-at 3,6,9${VCAP:+ --capacity}${VRL:+ --ragged-linear}${VRLB:+ --ragged-linear --ragged-linear-blocks $VRLB}"; do
    name=${prefix}_${dt}_${pol%% *}
    (OMP_NUM_THREADS=4 timeout 400 python3 -m raggedvit.cli export deit_base_patch16_224 "$@" --dtype $dt --policy $pol \
      -o "$WORK/$name.onnx" > "$RES/$name.log" 2>&1 &&
     OMP_NUM_THREADS=4 timeout 400 python3 -m raggedvit.cli validate "$WORK/$name.onnx" --device cuda --sample-images \
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
    kbench) timeout 300 python3 -m benchmarks.kernel $KB_FLAGS --out "$RES" > "$RES/kbench.log" 2>&1; rc=$?; tail -45 "$RES/kbench.log";;
    ort) OUT="$RES/ort" timeout 300 bash scripts/gpu_ort_checks.sh 1000 > "$RES/ort.log" 2>&1; rc=$?; tail -8 "$RES/ort.log";;
    gelu) timeout ${GLT:-200} python3 -m benchmarks.gelu --out "$RES" > "$RES/gelu.log" 2>&1; rc=$?; tail -30 "$RES/gelu.log";;
    opbench) timeout 200 python3 -m benchmarks.ort_op --out "$RES" > "$RES/opbench.log" 2>&1; rc=$?; tail -25 "$RES/opbench.log";;
    graph) timeout ${GT:-120} python3 -m benchmarks.check_cuda_graph --out "$RES" --policies "${GRAPH_POLICIES:-topk-l2:keep=0.5:at=4;cls-mass:mass=0.9:at=3,6,9}" ${GRAPH_FLAGS:-} > "$RES/graph.log" 2>&1; rc=$?; tail -6 "$RES/graph.log";;
    e2e) timeout ${ET:-420} python3 -m benchmarks.e2e --out "$RES" ${E2E_FLAGS:-} > "$RES/e2e.log" 2>&1; rc=$?; tail -40 "$RES/e2e.log";;
    serving)  # issue 13: one run, both models; --time-budget (230 s) leaves the timeout room for the report
      timeout ${SVT:-300} python3 -m benchmarks.serving --out "$RES" --work "$WORK/serving" ${SERVING_FLAGS:---policies \
        topk-l2:keep=0.5:at=4 cls-mass:mass=0.9:at=3,6,9 cls-mass:mass=0.9:at=3,6,9:dead-linear} \
        > "$RES/serving.log" 2>&1; rc=$?; tail -45 "$RES/serving.log";;
    overhead)  # issue 13: host time of a CUDA-graph run beside its GPU span (ORT replay, torch-captured export)
      timeout ${OVT:-300} python3 -m benchmarks.graph_overhead --out "$RES" --work "$WORK/overhead" ${OVH_FLAGS:-} \
        > "$RES/overhead.log" 2>&1; rc=$?; tail -14 "$RES/overhead.log" | cut -c1-400;;
    families)  # issue 12: pruned speed of an EVA02 and a BEiT export against the same model unpruned in ORT fp16
      timeout ${FMT:-280} python3 -m benchmarks.serving --out "$RES/families" --work "$WORK/families" \
        --models eva02_small_patch14_224,beit_base_patch16_224 --batches 1,32,128 --policies topk-l2:keep=0.5:at=4 \
        --variants ort_unpruned,ort_raggedvit --time-budget 240 > "$RES/families.log" 2>&1; rc=$?
      tail -12 "$RES/families.log";;
    validate)  # issue 5/6: fp16 CUDA-EP exports of deit_base pass `raggedvit validate --device cuda`
      rc=0; validate_exports deit_base "${VDTYPES:-fp16}" "$RES/validate.log" --seed 0 || rc=1
      grep -E "PASS|FAIL|max" "$RES/validate.log" | tail -8;;
    vckpt)  # seeded weights have zero biases: validate exports of a checkpoint that has them all
      rc=0
      timeout 120 python3 scripts/perturbed_checkpoint.py deit_base_patch16_224 "$WORK/pb.safetensors" >> "$RES/vckpt.log" 2>&1 || rc=1
      validate_exports deit_base_biased "${CKDTYPES:-fp32 fp16-all}" "$RES/vckpt.log" --checkpoint "$WORK/pb.safetensors" || rc=1
      grep -E "raggedvit validation|^\| 7 " "$RES/vckpt.log" | tail -8;;
    mutants)  # issue 14: every mutant must fail the fp16 rule on the CUDA EP, naming the images
      timeout ${MUT:-500} python3 -m pytest -q -m gpu -p no:cacheprovider -rxX tests/validators/test_mutations.py \
        > "$RES/mutants_gpu.log" 2>&1; rc=$?; tail -12 "$RES/mutants_gpu.log";;
    memcheck)  # issue 3: compute-sanitizer memcheck over >= 1000 fuzzed CUDA-EP calls (torch-free harness)
      timeout ${MT:-330} compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 \
        --kernel-name kns=_ragged --kernel-name kns=_select_ --kernel-name kns=_bias_gelu --kernel-name kns=_gather_layer_norm \
        --kernel-name kns=_patch_embed \
        --log-file "$RES/memcheck.log" python3 scripts/memcheck_ort_fuzz.py --calls ${MCALLS:-1000} ${MC_FLAGS:-} \
        > "$RES/memcheck_fuzz.log" 2>&1; rc=$?
      grep -v "No registered" "$RES/memcheck_fuzz.log" | tail -4; grep -h "ERROR SUMMARY" "$RES/memcheck.log" | tail -1;;
    speed)  # issue 11: traced exports keep >= 0.97x the hand-built graph's img/s
      B="$WORK/builder"; rm -rf "$B" && mkdir -p "$B" && tar xzf "$BUILDER_TGZ" -C "$B" &&
        cp raggedvit/custom_ops/libraggedvit_ort.so "$B/raggedvit/custom_ops/"
      timeout ${ST:-400} python3 -m benchmarks.traced_vs_builder --builder-src "$B" --work "$WORK/traced_vs_builder" \
        --out "$RES/traced_vs_builder.json" ${SPEED_FLAGS:-} > "$RES/speed.log" 2>&1; rc=$?; tail -30 "$RES/speed.log";;
    wheel)  # issue 15: the wheel built on the CPU machine (carried in dist/) installs and runs on the GPU
      rc=0; W=$(ls "$PWD"/dist/raggedvit-*.whl | head -1)
      ( set -e; python3 -m pip install -q --no-deps --no-index --force-reinstall --target "$WORK/wheel" "$W"
        cd "$WORK" && export PYTHONPATH=$WORK/wheel${ORT_GPU_DIR:+:$ORT_GPU_DIR}
        python3 -c "import raggedvit; print('raggedvit from', raggedvit.__file__)"
        python3 -m raggedvit.cli info
        python3 -m raggedvit.cli export deit_tiny_patch16_224 --seed 0 --policy topk-l2 --prune-at 4 --dtype fp16-all -o "$WORK/w.onnx"
        python3 -m raggedvit.cli validate "$WORK/w.onnx" --device cuda --sample-images --report "$RES/wheel_validate"
        python3 -c "from raggedvit.runtime import create_session as c; c('$WORK/w.onnx', 'cuda', disable_cpu_fallback=True, batch=4); print('every node on the CUDA EP (CPU fallback disabled)')"
        python3 -m raggedvit.cli bench "$WORK/w.onnx" --device cuda --cuda-graph --batch 1,32 --json "$RES/wheel_bench.json"
      ) > "$RES/wheel.log" 2>&1 || rc=1; tail -12 "$RES/wheel.log";;
    *) echo "unknown stage $stage"; rc=2;;
  esac
  echo "### stage $stage rc=$rc $(( $(date +%s) - t0 ))s"
done
