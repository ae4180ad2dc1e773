"""Where ONNX Runtime's CUDA EP puts an export's nodes: the Memcpy nodes of the optimized graph (each one a host
round trip, and what stops a CUDA-graph capture) and the nodes left to the CPU EP.

    python3 -m tests.support.ort_placement MODEL.onnx [--batch 1]      # from the checkout's root
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from raggedvit.runtime import create_session, session_options


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        so = session_options()
        so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        so.log_severity_level = 1  # warnings: ORT names the nodes it assigns to the CPU EP
        create_session(args.model, "cuda", options=so, batch=args.batch)
        opt = onnx.load(so.optimized_model_filepath, load_external_data=False)
    nodes = opt.graph.node
    print(f"{args.model.name}: {len(nodes)} nodes after ORT's optimizations;", Counter(n.op_type for n in nodes))
    producers = {o: n for n in nodes for o in n.output}
    for n in nodes:
        if n.op_type.startswith("Memcpy"):
            src = producers.get(n.input[0])
            users = [u.op_type for u in nodes if set(n.output) & set(u.input)]
            print(f"  {n.op_type}: {n.input[0]} (from {src.op_type if src else 'input'}) -> {users}")
    try:
        create_session(args.model, "cuda", disable_cpu_fallback=True, batch=args.batch)
        print("  every node on the CUDA EP (session.disable_cpu_ep_fallback=1 accepted)")
    except Exception as e:  # noqa: BLE001 - report ORT's reason
        print(f"  CPU fallback needed: {str(e)[:600]}")


if __name__ == "__main__":
    main()
