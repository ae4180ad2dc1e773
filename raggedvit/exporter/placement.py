"""Which nodes of an export ONNX Runtime's CUDA EP has a kernel for, judged on the CPU.

A node's signature is (domain, op, the model's opset for that domain, its input types, its output types). The
table, data/ort_cuda_placement.json, says for every signature that raggedvit's export kinds produce whether the
CUDA EP of the onnxruntime-gpu version that the [gpu] extra pins has a kernel for it: probed on a GPU by
scripts/ort_cuda_signatures.py (a one-node session with CPU fallback disabled is created exactly when the EP's
kernel registry, the one docs/OperatorKernels.md lists, has a kernel for the op, version and types). com.raggedvit's
own CUDA kernels are RAGGED_CUDA, as custom_ops/registration.cc registers them.

A node whose signature the table says runs on the CPU, or which the table does not hold (an op or a type no export
had when it was probed: probe it again on a GPU), is `Unplaced`; so is a node with an input or output whose type the
file does not record ('?'): which kernel runs it depends on that type, and it is never guessed (the exporter records
every value's type and build_model refuses an export without; a file from before that is exported again). Such a
node runs on the CPU EP, which a session with `disable_cpu_fallback=True` refuses and a CUDA graph cannot hold. What
this cannot see: ORT's graph optimizations (they run first and may fuse nodes) and the shape arithmetic ORT moves to
the CPU on its own (fold it with create_session(batch=...)).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from raggedvit.exporter.metadata import RAGGED_DOMAIN

__all__ = ["RAGGED_CUDA", "PlacementTable", "Unplaced", "cuda_unplaced", "node_signatures", "placement_table"]

DATA = Path(__file__).resolve().parent / "data" / "ort_cuda_placement.json"
_HALF = frozenset({"float16", "bfloat16"})
_INDEX = frozenset({"int32", "int64"})
# com.raggedvit ops with a CUDA kernel: {op: {input index: allowed types}}; an input not named takes what the CPU
# kernel takes. custom_ops/registration.cc registers one CUDA op per allowed type.
RAGGED_CUDA: dict[str, dict[int, frozenset[str]]] = {
    "RaggedAttention": {1: _INDEX},
    "RaggedSelect": {},
    "RaggedMerge": {0: frozenset({"float", "float16"})},
    "PatchEmbed": {0: frozenset({"float", "float16"})},
    "BiasGelu": {0: _HALF},
    "RaggedLinear": {0: _HALF},
    "GatherLayerNorm": {0: _HALF},
}
_TYPE = {v: k.lower() for k, v in TensorProto.DataType.items()}  # TensorProto.FLOAT -> "float"

Signature = tuple[str, str, int, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class Unplaced:
    """A node with no CUDA EP kernel: its name, signature and why."""

    node: str
    signature: Signature
    reason: str

    def __str__(self) -> str:
        domain, op, opset, ins, outs = self.signature
        where = f"{domain or 'ai.onnx'}::{op} opset {opset}"
        return f"{self.node} ({where}, inputs {', '.join(ins) or '-'} -> {', '.join(outs) or '-'}): {self.reason}"


@dataclass(frozen=True)
class PlacementTable:
    """source: how and with which onnxruntime-gpu it was probed; cuda: {signature: has a CUDA kernel}."""

    source: str
    onnxruntime: str
    cuda: dict[Signature, bool]


def _signature(row: list) -> Signature:
    domain, op, opset, ins, outs = row
    return (domain, op, int(opset), tuple(ins), tuple(outs))


@functools.cache
def placement_table(path: Path = DATA) -> PlacementTable:
    """The probed table (see the module's doc)."""
    data = json.loads(Path(path).read_text())
    cuda = {_signature(r["signature"]): bool(r["cuda"]) for r in data["signatures"]}
    return PlacementTable(data["source"], data["onnxruntime"], cuda)


def _value_types(model: onnx.ModelProto) -> dict[str, str]:
    """{value name: element type name ('float', 'int64', ...)} of every value whose tensor type the model records."""
    pairs = [
        (v.name, v.type.tensor_type.elem_type)
        for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)
        if v.type.HasField("tensor_type")
    ]
    pairs += [(t.name, t.data_type) for t in model.graph.initializer]
    pairs += [
        (n.output[0], a.t.data_type)
        for n in model.graph.node
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
        for a in n.attribute
        if a.name == "value"
    ]
    return {name: _TYPE.get(elem, str(elem)) for name, elem in pairs if elem}


def node_signatures(model: onnx.ModelProto) -> Iterator[tuple[Signature, onnx.NodeProto]]:
    """(signature, node) of every top-level node: unknown types are '?', absent optional inputs '-'."""
    opset = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    types = _value_types(model)
    for node in model.graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        ins = tuple(types.get(i, "?") if i else "-" for i in node.input)
        outs = tuple(types.get(o, "?") if o else "-" for o in node.output)
        yield (domain, node.op_type, opset.get(domain, 1), ins, outs), node


def _untyped(sig: Signature) -> str | None:
    _, _, _, ins, outs = sig
    where = [f"input {i}" for i, t in enumerate(ins) if t == "?"]
    where += [f"output {i}" for i, t in enumerate(outs) if t == "?"]
    if not where:
        return None
    return (
        f"the file records no type for its {', '.join(where)}: its CUDA kernel cannot be judged (export it again: "
        "the exporter records every value's type)"
    )


def _judge(sig: Signature, table: PlacementTable) -> str | None:
    domain, op, _, ins, _ = sig
    if (why := _untyped(sig)) is not None:  # any node, any input or output: never judged on a guessed type
        return why
    if domain == RAGGED_DOMAIN:
        if op not in RAGGED_CUDA:
            return "the op library has no CUDA kernel for it"
        for i, allowed in RAGGED_CUDA[op].items():
            if i < len(ins) and ins[i] != "-" and ins[i] not in allowed:
                return f"input {i} is {ins[i]}; the op library's CUDA kernel takes {' or '.join(sorted(allowed))}"
        return None
    known = table.cuda.get(sig)
    if known is None:
        return (
            f"not in the placement table (onnxruntime {table.onnxruntime}): probe it on a GPU with "
            "scripts/ort_cuda_signatures.py"
        )
    return None if known else f"the CUDA EP of onnxruntime {table.onnxruntime} has no kernel for these types"


def cuda_unplaced(model: onnx.ModelProto | str | Path, table: PlacementTable | None = None) -> list[Unplaced]:
    """The nodes of `model` (its top-level graph) that no CUDA EP kernel runs, in graph order; [] when every node
    has one."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    table = table or placement_table()
    out = []
    for sig, node in node_signatures(model):
        reason = _judge(sig, table)
        if reason is not None:
            out.append(Unplaced(node.name or f"{node.op_type} -> {', '.join(node.output)}", sig, reason))
    return out
