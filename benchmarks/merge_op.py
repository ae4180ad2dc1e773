"""CPU cost of one tome merge: the com.raggedvit::RaggedMerge node vs the traced standard-op merge it replaces.

    python3 -m benchmarks.merge_op [--out benchmarks/results] [--rounds 9]

The traced merge is `merge_tokens_reference` exported as the exporter exports a tome stage (torch.onnx dynamo, the
exporter's translations and opset, optimize); the fused one is a single RaggedMerge node. deit_small sizes (n = 197,
C = 384, H = 6, Dh = 64, one class token, r = 8: tests/support/merge_cases.py's deit_small cases), float32, qkv bias
and sizes given, B = 1 and 8. Both run on the
CPU EP with one intra-op thread (ORT runs the graph on the calling thread), inputs and outputs bound once; the
per-call time is the minimum over rounds of the calling thread's CPU time (other load on a shared machine barely
moves it) and of the wall time. Writes merge_op_cpu.json under --out (overwritten in place) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import onnxruntime as ort
import torch
from onnx import TensorProto

from benchmarks.env import environment, result_path
from raggedvit.exporter.checks import OPSET
from raggedvit.exporter.translations import TRANSLATIONS
from raggedvit.pruning.merge import merge_tokens_reference
from raggedvit.runtime import create_session
from tests.support.merge_cases import MERGE_CASES, make_merge_inputs, merge_attrs
from tests.support.ort_models import MERGE_INPUTS, MERGE_OUTPUTS, merge_model

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {case.B: case for case in MERGE_CASES if case.name.startswith("deit_small-")}  # B = 1 and 8
_INPUTS = MERGE_INPUTS[:5]  # x, qkv, qkv_bias, size, cu (no fused residual: the traced merge has none either)


class _Traced(torch.nn.Module):
    def __init__(self, attrs: dict[str, int]) -> None:
        super().__init__()
        self.attrs = attrs

    def forward(self, x, qkv, qkv_bias, size, cu):
        a = self.attrs
        return tuple(merge_tokens_reference(x, qkv, qkv_bias, size, cu, a["num_heads"], a["num_prefix"], a["r"], True))


def traced_model(feeds: dict[str, torch.Tensor], attrs: dict[str, int]) -> tuple[bytes, int]:
    """The standard-op merge for these input shapes and its node count."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_Traced(attrs), tuple(feeds.values()), dynamo=True, input_names=list(_INPUTS),
                                    output_names=list(MERGE_OUTPUTS), custom_translation_table=TRANSLATIONS,
                                    opset_version=OPSET, optimize=True, verbose=False)  # fmt: skip
    return program.model_proto.SerializeToString(), len(program.model_proto.graph.node)


def time_call(model: bytes, feeds: dict[str, torch.Tensor], rounds: int, reps: int) -> tuple[float, float]:
    """(thread CPU µs, wall µs) per call: minima over rounds of reps calls."""
    sess = create_session(model, "cpu", intra_op_threads=1)
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value.numpy()))
    for name in MERGE_OUTPUTS:
        binding.bind_output(name, "cpu")
    for _ in range(max(10, reps // 4)):
        sess.run_with_iobinding(binding)
    cpu, wall = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            sess.run_with_iobinding(binding)
        wall.append((time.perf_counter() - t0) / reps * 1e6)
        cpu.append((time.thread_time() - c0) / reps * 1e6)
    return min(cpu), min(wall)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rows = []
    for B, case in sorted(CASES.items()):
        attrs = merge_attrs(case, True)
        fused = merge_model(TensorProto.FLOAT, attrs, qkv_bias=True, size=True)
        feeds = make_merge_inputs(case, seed=B)
        traced, nodes = traced_model(feeds, attrs)
        reps = 300 // B
        t_cpu, t_wall = time_call(traced, feeds, args.rounds, reps)
        f_cpu, f_wall = time_call(fused, feeds, args.rounds, reps)
        times = {"traced_cpu_us": t_cpu, "traced_wall_us": t_wall, "ragged_merge_cpu_us": f_cpu,
                 "ragged_merge_wall_us": f_wall}  # fmt: skip
        rows.append({"B": B, "traced_nodes": nodes} | {k: round(v, 1) for k, v in times.items()})
        print(f"B={B}: traced merge ({nodes} nodes) {t_cpu:7.1f} us, RaggedMerge {f_cpu:6.1f} us "
              f"(thread CPU time; wall {t_wall:.1f} / {f_wall:.1f} us)", flush=True)  # fmt: skip
    case = CASES[1]
    result = {
        "machine": "cpu",
        "env": environment(),
        "dtype": "float32",
        "shape": {
            "n": case.n,
            "C": case.C,
            "H": case.H,
            "Dh": case.Dh,
            "num_prefix": case.num_prefix,
            "r": case.r,
            "class_token": 1,
        },  # fmt: skip
        "rounds": args.rounds,
        "method": "one intra-op thread, IO bound once; per call the minimum over rounds of thread CPU time and wall",
        "rows": rows,
    }
    path = result_path(args.out, "merge_op", "cpu")
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
