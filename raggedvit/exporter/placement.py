"""Which nodes of an export ONNX Runtime's CUDA EP has a kernel for, judged on the CPU.

The table is data/ort_cuda_kernels.json: every kernel the CUDA EP of the onnxruntime-gpu version that raggedvit's
[gpu] extra pins registers (op, domain, opset range, type constraints) and the formal inputs of those ops' schemas,
written by scripts/dump_ort_cuda_kernels.py from ORT's own kernel registry (the one its docs/OperatorKernels.md is
generated from). com.raggedvit's CUDA kernels are RAGGED_CUDA, as custom_ops/registration.cc registers them.

A node has a CUDA kernel when a kernel of its (domain, op) covers the opset version its schema has in the model
(the newest schema version at or below the model's opset for that domain) and, for every type constraint that the
kernel declares, each node input bound to the constraint has an allowed type. An input whose type the model does
not record is not judged. A node without a kernel runs on the CPU EP, which a session with
`disable_cpu_fallback=True` or a CUDA graph refuses. What this check cannot see: ORT's graph optimizations (they
run first, and may fuse nodes into others) and the shape arithmetic ORT moves to the CPU on its own (fold it with
create_session(batch=...)).
"""

from __future__ import annotations

import bisect
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

__all__ = ["RAGGED_CUDA", "KernelTable", "Unplaced", "cuda_unplaced", "kernel_table"]

DATA = Path(__file__).resolve().parent / "data" / "ort_cuda_kernels.json"
_FLOATS16 = frozenset({"tensor(float16)", "tensor(bfloat16)"})
_INDEX = frozenset({"tensor(int32)", "tensor(int64)"})
# com.raggedvit ops with a CUDA kernel: {op: {input index: allowed types}} (an input not named takes any type the
# CPU kernel takes); custom_ops/registration.cc registers one CUDA op per listed type
RAGGED_CUDA: dict[str, dict[int, frozenset[str]]] = {
    "RaggedAttention": {1: _INDEX},
    "RaggedSelect": {},
    "PatchEmbed": {0: frozenset({"tensor(float)", "tensor(float16)"})},
    "BiasGelu": {0: _FLOATS16},
    "RaggedLinear": {0: _FLOATS16},
    "GatherLayerNorm": {0: _FLOATS16},
}
_RAGGED_DOMAIN = "com.raggedvit"


@dataclass(frozen=True)
class Unplaced:
    """A node with no CUDA EP kernel: its name, op, domain, the opset version its schema has, its input types, and
    why (no kernel for the op, none for the version, or the input and type that no kernel allows)."""

    node: str
    op: str
    domain: str
    version: int
    inputs: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.domain}::{self.op} v{self.version}, inputs {', '.join(self.inputs)}): {self.reason}"


@dataclass(frozen=True)
class KernelTable:
    """kernels: {(domain, op): [(since, until, {constraint: allowed types})]}; schemas: {(domain, op): [(since,
    [input constraint or type string per formal input], variadic last input)]} sorted by since."""

    source: str
    onnxruntime: str
    kernels: dict[tuple[str, str], list[tuple[int, int, dict[str, frozenset[str]]]]]
    schemas: dict[tuple[str, str], list[tuple[int, list[str], bool]]]


@functools.cache
def kernel_table(path: Path = DATA) -> KernelTable:
    """The CUDA EP's kernel table (see the module's doc)."""
    data = json.loads(Path(path).read_text())
    kernels: dict[tuple[str, str], list] = {}
    for k in data["kernels"]:
        types = {name: frozenset(t) for name, t in k["types"].items()}
        kernels.setdefault((k["domain"], k["op"]), []).append((k["since"], k["until"], types))
    schemas: dict[tuple[str, str], list] = {}
    for s in data["schemas"]:
        variadic = bool(s["inputs"]) and s["inputs"][-1][2] == "Variadic"
        schemas.setdefault((s["domain"], s["op"]), []).append((s["since"], [i[1] for i in s["inputs"]], variadic))
    for rows in schemas.values():
        rows.sort(key=lambda r: r[0])
    return KernelTable(data["source"], data["onnxruntime"], kernels, schemas)


def _value_types(model: onnx.ModelProto) -> dict[str, str]:
    """{value name: 'tensor(float)'-style type} of every value the model records a tensor type for."""
    out = {}
    values = [*model.graph.value_info, *model.graph.input, *model.graph.output]
    pairs = [(v.name, v.type.tensor_type.elem_type) for v in values if v.type.HasField("tensor_type")]
    pairs += [(t.name, t.data_type) for t in model.graph.initializer]
    for node in model.graph.node:  # Constant nodes: their value's type
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    pairs.append((node.output[0], a.t.data_type))
    for name, elem in pairs:
        if elem:
            out[name] = f"tensor({_TYPE.get(elem, str(elem))})"
    return out


_TYPE = {
    TensorProto.FLOAT: "float", TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16",
    TensorProto.DOUBLE: "double", TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.INT16: "int16",
    TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.UINT16: "uint16", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.BOOL: "bool", TensorProto.STRING: "string",
}  # fmt: skip


def _judge(node: onnx.NodeProto, opset: dict[str, int], types: dict[str, str], table: KernelTable) -> Unplaced | None:
    domain = node.domain or "ai.onnx"
    inputs = tuple(types.get(i, "?") if i else "-" for i in node.input)
    name = node.name or f"{node.op_type}->{node.output[0] if node.output else ''}"
    if domain == _RAGGED_DOMAIN:
        spec = RAGGED_CUDA.get(node.op_type)
        if spec is None:
            return Unplaced(name, node.op_type, domain, opset.get(domain, 1), inputs, "com.raggedvit has no CUDA op")
        for i, allowed in spec.items():
            if i < len(inputs) and inputs[i] not in ("?", "-") and inputs[i] not in allowed:
                why = f"input {i} is {inputs[i]}; the CUDA op takes {', '.join(sorted(allowed))}"
                return Unplaced(name, node.op_type, domain, opset.get(domain, 1), inputs, why)
        return None
    schemas = table.schemas.get((domain, node.op_type))
    kernels = table.kernels.get((domain, node.op_type))
    model_opset = opset.get(domain, opset.get("ai.onnx" if domain == "" else domain, 1))
    if not kernels or not schemas:
        return Unplaced(name, node.op_type, domain, model_opset, inputs, "the CUDA EP has no kernel for this op")
    k = bisect.bisect_right([s[0] for s in schemas], model_opset) - 1
    if k < 0:
        return Unplaced(name, node.op_type, domain, model_opset, inputs, f"no schema at opset {model_opset}")
    since, formals, variadic = schemas[k]
    versioned = [kn for kn in kernels if kn[0] <= since <= kn[1]]
    if not versioned:
        ranges = ", ".join(f"{a}-{b if b < 2**30 else ''}" for a, b, _ in kernels)
        return Unplaced(name, node.op_type, domain, since, inputs, f"CUDA kernels exist for versions {ranges} only")
    misses = []
    for _, _, constraints in versioned:
        bad = []
        for i, t in enumerate(inputs):
            formal = formals[min(i, len(formals) - 1)] if formals and (i < len(formals) or variadic) else None
            if formal in constraints and t not in ("?", "-") and t not in constraints[formal]:
                bad.append(f"input {i} is {t}, the kernel's {formal} takes {', '.join(sorted(constraints[formal]))}")
        if not bad:
            return None
        misses.append(bad[0])
    return Unplaced(name, node.op_type, domain, since, inputs, misses[0])


def cuda_unplaced(model: onnx.ModelProto | str | Path, table: KernelTable | None = None) -> list[Unplaced]:
    """The nodes of `model` (top-level graph) that no CUDA EP kernel runs, in graph order ([] when every node has
    one). Types come from the model's value_info, inputs, outputs, initializers and Constant nodes."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    table = table or kernel_table()
    opset = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    types = _value_types(model)
    return [u for node in model.graph.node if (u := _judge(node, opset, types, table)) is not None]
