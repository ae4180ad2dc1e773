#!/usr/bin/env bash
# CI: export DeiT-Tiny (seeded weights, q/k sharpened by load_vit) with cls-mass and topk-l2 pruning in fp32,
# validate each on the ONNX Runtime CPU EP against the PyTorch reference on the real sample images, and
# print the Markdown reports. Exits non-zero if an export or a validation fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-build/ci-export}"
mkdir -p "$OUT"
CLI=(python3 -m raggedvit)
MODEL=deit_tiny_patch16_224
status=0

"${CLI[@]}" info
python3 -m raggedvit._versions  # fails outside the supported torch / Triton / timm range

"${CLI[@]}" export "$MODEL" --seed 0 --policy cls-mass --mass 0.9 --prune-at 3,6,9 --dtype fp32 \
    -o "$OUT/deit_tiny_cls_mass.onnx"
"${CLI[@]}" export "$MODEL" --seed 0 --policy topk-l2 --keep 0.5 --prune-at 4,7 --dtype fp32 \
    -o "$OUT/deit_tiny_topk_l2.onnx"

for name in deit_tiny_cls_mass deit_tiny_topk_l2; do
    echo
    "${CLI[@]}" validate "$OUT/$name.onnx" --sample-images --device cpu \
        --report "$OUT/$name.report" || status=$?
done
exit "$status"
