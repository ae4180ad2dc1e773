#!/usr/bin/env bash
# CI: build the wheel and check its tag and metadata (scripts/check_wheel.py); install it into a fresh virtual
# environment; then, from a folder outside the clone, with a cleared environment and only the venv's bin on PATH
# (no compiler, no ORT headers, no source tree), run `raggedvit info`, an export, a validate on the CPU EP and
# triton-repo. The venv sees the system site-packages for the dependencies (torch and co. are not downloaded
# again); raggedvit itself must be the wheel's, which is asserted.
#
#     bash scripts/ci_wheel_check.sh [WORK_DIR]     # default: a temporary folder, removed afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
if [[ $# -ge 1 ]]; then
    WORK=$(mkdir -p "$1" && cd "$1" && pwd)
else
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
fi
case "$WORK/" in "$PWD"/*) echo "WORK_DIR must be outside the clone" >&2; exit 2 ;; esac

echo "== wheel: build"
rm -rf "$WORK/dist" "$WORK/venv" "$WORK/run"
python3 -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" .
WHEEL=$(ls "$WORK"/dist/raggedvit-*.whl)
python3 scripts/check_wheel.py "$WHEEL"

echo "== wheel: install into a fresh venv ($(basename "$WHEEL"))"
python3 -m venv --system-site-packages --without-pip "$WORK/venv"
# pip from the system site-packages installs into the venv; --force-reinstall: the system may hold raggedvit
# (an editable install of this clone), which stays where it is and is shadowed by the venv's copy
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$WHEEL"
mkdir "$WORK/run"

clean() {  # run "$@" in $WORK/run with an empty environment and only the venv's bin on PATH
    (cd "$WORK/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$WORK/venv/bin" "$@")
}
clean "$BASH" -c 'for tool in cc gcc g++ c++ clang nvcc; do
    if command -v "$tool"; then echo "a compiler is on PATH: $tool" >&2; exit 1; fi; done'
clean python - "$WORK/venv" <<'EOF'
import shutil, sys
from pathlib import Path
import raggedvit, raggedvit.custom_ops as ops
venv = Path(sys.argv[1]).resolve()
where = {"raggedvit": raggedvit.__file__, "op library": ops.library_path()}
for what, path in where.items():
    assert Path(path).resolve().is_relative_to(venv), f"{what} is not the wheel's: {path}"
info = ops.library_info()["build"]
assert info["archs"] == [80, 86, 89, 90], f"AOT cubins for {info['archs']}, expected sm_80/86/89/90"
assert shutil.which("g++") is None and shutil.which("cc") is None
print(f"raggedvit {raggedvit.__version__} from the wheel: {where['raggedvit']}; cubins for sm_{info['archs']}")
EOF

echo "== wheel: info, export, validate (CPU EP), triton-repo"
clean raggedvit info
clean raggedvit export deit_tiny_patch16_224 --seed 0 --policy topk-l2 --prune-at 4 -o deit_tiny.onnx
clean raggedvit validate deit_tiny.onnx --sample-images --device cpu
clean raggedvit triton-repo deit_tiny.onnx triton --name deit_tiny --kind cpu
test -f "$WORK/run/triton/deit_tiny/config.pbtxt" -a -f "$WORK/run/triton/deit_tiny/libraggedvit_ort.so"
echo "== wheel: checks passed in $((SECONDS - start)) s"
