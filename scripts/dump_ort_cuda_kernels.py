"""Writes raggedvit/exporter/data/ort_cuda_kernels.json: every kernel that ONNX Runtime's CUDA EP registers, from
the kernel registry of an installed onnxruntime-gpu (the table its docs/OperatorKernels.md is generated from, by
tools/python/gen_opkernel_doc.py, through the same get_all_opkernel_def call), and the formal inputs and outputs
of those ops' schemas, so that a type constraint can be bound to a node's inputs.

    python3 scripts/dump_ort_cuda_kernels.py [--out raggedvit/exporter/data/ort_cuda_kernels.json]

Run it where onnxruntime-gpu is installed with the version raggedvit's [gpu] extra pins (the GPU machine); the CUDA
EP's library must load (the registry lists its kernels only then). The file names the version it came from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as C

OUT = Path(__file__).resolve().parent.parent / "raggedvit" / "exporter" / "data" / "ort_cuda_kernels.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"onnxruntime {ort.__version__} here has no CUDA EP")
    # the CUDA EP's kernels are registered once its library is loaded: a session with the EP loads it
    ort.InferenceSession(_tiny_model(), providers=["CUDAExecutionProvider"])
    kernels = []
    for k in C.get_all_opkernel_def():
        if k.provider != "CUDAExecutionProvider":
            continue
        since, until = k.version_range
        constraints = {name: sorted(set(types)) for name, types in sorted(k.type_constraints.items())}
        kernels.append({"domain": k.domain or "ai.onnx", "op": k.op_name, "since": since, "until": until,
                        "types": constraints})  # fmt: skip
    if not kernels:
        raise SystemExit("the kernel registry lists no CUDAExecutionProvider kernel: the CUDA EP did not load")
    ops = {(k["domain"], k["op"]) for k in kernels}
    schemas = []
    for s in C.get_all_operator_schema():
        domain = s.domain or "ai.onnx"
        if (domain, s.name) not in ops:
            continue
        schemas.append({
            "domain": domain, "op": s.name, "since": s.since_version,
            "inputs": [[i.name, i.typeStr, str(i.option).rsplit(".", 1)[-1]] for i in s.inputs],
            "outputs": [[o.name, o.typeStr, str(o.option).rsplit(".", 1)[-1]] for o in s.outputs],
        })  # fmt: skip
    key = lambda r: (r["domain"], r["op"], r["since"])
    data = {
        "source": (
            f"onnxruntime-gpu {ort.__version__}: onnxruntime_pybind11_state.get_all_opkernel_def() (the registry that "
            "docs/OperatorKernels.md is generated from) and get_all_operator_schema(); "
            "written by scripts/dump_ort_cuda_kernels.py"
        ),
        "onnxruntime": ort.__version__,
        "kernels": sorted(kernels, key=key),
        "schemas": sorted(schemas, key=key),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    print(f"wrote {args.out}: {len(kernels)} CUDA kernels of {len(ops)} ops, {len(schemas)} schemas")
    return 0


def _tiny_model() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


if __name__ == "__main__":
    raise SystemExit(main())
