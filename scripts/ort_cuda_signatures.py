"""The CUDA EP placement table: which node signatures of raggedvit's exports ONNX Runtime's CUDA EP has a kernel for.

    python3 scripts/ort_cuda_signatures.py collect --out sigs.json          # here: every export kind's signatures
    python3 scripts/ort_cuda_signatures.py probe sigs.json                  # on a GPU, with onnxruntime-gpu
        [--out raggedvit/exporter/data/ort_cuda_placement.json]
    python3 scripts/ort_cuda_signatures.py from-doc sigs.json KERNELS.json   # here, from OperatorKernels.md rows
        [--out raggedvit/exporter/data/ort_cuda_placement.json]

A signature is (domain, op, the model's opset for the domain, input types, output types). `collect` exports every
kind of tests/support/export_kinds.py and keeps one node of each signature. `probe` builds a one-node model of each
(the node with its attributes, its inputs as graph inputs of their types) and creates an ONNX Runtime session on
the CUDA EP with CPU fallback disabled: the session is created exactly when the CUDA EP has a kernel for the node
(the registry lookup of op, domain, version and type constraints that docs/OperatorKernels.md lists). The table
names the onnxruntime-gpu version it was probed with. com.raggedvit nodes are left out: the op library's CUDA
kernels are raggedvit.exporter.placement.RAGGED_CUDA. ORT's kernel registry cannot be listed directly from the
wheel the GPU machine gets (get_all_opkernel_def loads every provider, TensorRT's too, which is not there).

`from-doc` decides the same signatures from rows of ORT's docs/OperatorKernels.md (CUDAExecutionProvider section,
transcribed into scripts/data/ort_cuda_kernels_doc.json with the commit they were read at): a kernel row matches
when its opset range holds the version of the op's schema at the model's opset, and every node input and output
bound to one of the row's type constraints has a listed type. Schemas come from onnx (ai.onnx) and from the
installed onnxruntime (com.microsoft). A probe on a GPU replaces that table with a measured one.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "raggedvit" / "exporter" / "data" / "ort_cuda_placement.json"


def collect(out: Path) -> int:
    import onnx

    from raggedvit.exporter.placement import node_signatures
    from tests.support.export_kinds import export_kinds

    seen: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, dtype, path in export_kinds(Path(tmp)):
            model = onnx.load(str(path), load_external_data=False)
            for sig, node in node_signatures(model):
                if sig[0] == "com.raggedvit":
                    continue
                key = json.dumps(sig)
                entry = seen.setdefault(key, {"signature": sig, "node": "", "kinds": []})
                entry["node"] = entry["node"] or base64.b64encode(node.SerializeToString()).decode()
                entry["kinds"].append(f"{kind} {dtype}")
    out.write_text(json.dumps(sorted(seen.values(), key=lambda e: json.dumps(e["signature"])), indent=0) + "\n")
    print(f"wrote {out}: {len(seen)} signatures")
    return 0


def _one_node_model(sig: list, node_bytes: str):
    import onnx
    from onnx import helper

    domain, _op, opset, inputs, outputs = sig
    node = onnx.NodeProto()
    node.ParseFromString(base64.b64decode(node_bytes))
    node.name = "probe"
    if "?" in (*inputs, *outputs):  # a probe of a guessed type would decide another signature
        raise ValueError(f"{sig}: a value of unknown type ('?'); the exporter records every value's type")

    def elem(t: str) -> int:
        return onnx.TensorProto.DataType.Value(t.upper())

    names = {}
    graph_inputs = []
    for i, (name, t) in enumerate(zip(node.input, inputs)):
        if not name:
            continue
        if name not in names:
            names[name] = f"in{i}"
            graph_inputs.append(helper.make_tensor_value_info(names[name], elem(t), None))
    node.input[:] = [names.get(n, "") for n in node.input]
    outs = [helper.make_tensor_value_info(f"out{i}", elem(t), None) for i, t in enumerate(outputs) if t != "-"]
    node.output[:] = [f"out{i}" if n else "" for i, n in enumerate(node.output)]
    graph = helper.make_graph([node], "probe", graph_inputs, outs)
    opsets = [helper.make_opsetid("", opset if domain == "" else 20)]
    if domain:
        opsets.append(helper.make_opsetid(domain, opset))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def probe(sigs: Path, out: Path) -> int:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"onnxruntime {ort.__version__} here has no CUDA EP")
    rows = []
    for entry in json.loads(sigs.read_text()):
        sig = entry["signature"]
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            model = _one_node_model(sig, entry["node"])
            ort.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
            cuda, why = True, ""
        except Exception as e:  # noqa: BLE001 - the refusal is the answer
            cuda, why = False, str(e).splitlines()[0][:300]
        rows.append({"signature": sig, "cuda": cuda, **({"error": why} if why else {}), "kinds": entry["kinds"]})
        print(("cuda " if cuda else "CPU  ") + " ".join(map(str, sig)) + (f"  [{why}]" if why else ""), flush=True)
    data = {
        "source": (
            f"onnxruntime-gpu {ort.__version__}, CUDAExecutionProvider: a one-node session per signature with CPU "
            "fallback disabled (scripts/ort_cuda_signatures.py probe)"
        ),
        "onnxruntime": ort.__version__,
        "signatures": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=0) + "\n")
    print(f"wrote {out}: {sum(r['cuda'] for r in rows)} of {len(rows)} signatures on the CUDA EP")
    return 0


def _versions(cell: str) -> tuple[int, int]:
    """OperatorKernels.md's OpSet Version cell: '14+', '13' or '[7, 12]' -> (since, until)."""
    cell = cell.strip()
    if cell.endswith("+"):
        return int(cell[:-1]), 10**9
    if cell.startswith("["):
        lo, hi = cell.strip("[]").split(",")
        return int(lo), int(hi)
    return int(cell), int(cell)


def _schemas(domain: str, op: str) -> list[tuple[int, list[str], list[str]]]:
    """(since_version, formal input type strings, formal output type strings) of every schema version of op."""
    import onnx.defs
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    if domain == "":
        return [(s.since_version, [i.type_str for i in s.inputs], [o.type_str for o in s.outputs])
                for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain == ""]  # fmt: skip
    return [(s.since_version, [i.typeStr for i in s.inputs], [o.typeStr for o in s.outputs])
            for s in C.get_all_operator_schema() if s.name == op and s.domain == domain]  # fmt: skip


def doc_verdict(sig: list, rows: list[dict]) -> tuple[bool, str]:
    """Whether a kernel row of the op covers the signature, and why not."""
    domain, op, opset, inputs, outputs = sig
    schemas = sorted(s for s in _schemas(domain, op) if s[0] <= opset)
    if not schemas:
        return False, f"no schema of {op} at opset {opset}"
    since, formal_in, formal_out = schemas[-1]
    if "?" in (*inputs, *outputs):
        return False, "a value of unknown type ('?'): no kernel row can be matched without guessing it"
    misses = []
    for row in rows:
        lo, hi = _versions(row["versions"])
        if not lo <= since <= hi:
            continue
        allowed = {name: {t[len("tensor(") : -1] for t in types} for name, types in row["types"].items()}
        bad = []
        for values, formals in ((inputs, formal_in), (outputs, formal_out)):
            for i, t in enumerate(values):
                formal = formals[min(i, len(formals) - 1)] if formals else None
                if formal in allowed and t != "-" and t not in allowed[formal]:
                    bad.append(f"{formal} = {t} is not among {sorted(allowed[formal])}")
        if not bad:
            return True, ""
        misses.append(f"{row['versions']}: {bad[0]}")
    return False, "; ".join(misses) or f"no CUDA kernel row covers version {since}"


def from_doc(sigs: Path, doc: Path, out: Path) -> int:
    kernels = json.loads(doc.read_text())
    rows = {("" if o["domain"] == "ai.onnx" else o["domain"], o["op"]): o["kernels"] for o in kernels["ops"]}
    table = []
    for entry in json.loads(sigs.read_text()):
        sig = entry["signature"]
        ok, why = doc_verdict(sig, rows.get((sig[0], sig[1]), []))
        table.append({"signature": sig, "cuda": ok, **({"error": why} if why else {}), "kinds": entry["kinds"]})
        print(("cuda " if ok else "CPU  ") + " ".join(map(str, sig)) + (f"  [{why}]" if why else ""))
    data = {
        "source": f"{kernels['source']} (transcribed: scripts/data/ort_cuda_kernels_doc.json), decided by "
        "scripts/ort_cuda_signatures.py from-doc; not yet probed with the pinned onnxruntime-gpu",
        "onnxruntime": "OperatorKernels.md@" + kernels["source"].split("commit ")[1][:7],
        "signatures": table,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=0) + "\n")
    print(f"wrote {out}: {sum(r['cuda'] for r in table)} of {len(table)} signatures on the CUDA EP")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("probe")
    p.add_argument("sigs", type=Path)
    p.add_argument("--out", type=Path, default=OUT)
    d = sub.add_parser("from-doc")
    d.add_argument("sigs", type=Path)
    d.add_argument("doc", type=Path)
    d.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.command == "collect":
        return collect(args.out)
    return probe(args.sigs, args.out) if args.command == "probe" else from_doc(args.sigs, args.doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
