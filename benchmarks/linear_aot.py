"""The shipped (AOT) RaggedLinear cubins through ONNX Runtime's CUDA EP, one op library per candidate tile config.

    python3 -m benchmarks.linear_aot --libs NAME=PATH[,NAME=PATH...] [--out benchmarks/results] [--batches 32,128]

`benchmarks.linear_persistent` times the Triton kernel JIT-compiled by the GPU machine's Triton, but the op library
ships cubins that the package build compiles with its own Triton (another version: the same tiles time differently).
This probe times what ships: for each library (an op library built with one candidate `_TMA` config, e.g. from a
worktree whose `_linear_config.py` differs), in a child process with RAGGEDVIT_ORT_LIBRARY pointing at it, one
RaggedLinear node per case of `linear_persistent` (deit_base's and deit_small's four block GEMMs over the capacity
layout of B x 197 rows and the live rows after each cls-mass stage; fp16, bias, GELU after fc1, the residual after
proj and fc2, int64 CuSeqlens as the exports pass), run node by node with io binding; the kernel's GPU time is
CUPTI's (torch.profiler) over --forwards runs. Each result is checked against `ragged_linear_reference` over the live
rows. The parent also times cuBLAS (F.linear) over the live rows, the floor of `linear_persistent`. Each record
names the library's build Triton (`lib_triton`) and its "tma" config (`lib_tma`).
Writes linear_aot_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.e2e.profile import count_kernels
from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from benchmarks.linear_persistent import GEMMS, MODELS, TOKENS

KERNEL_PREFIX = "_ragged_linear"


def cases(batches: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every (model, batch, gemm, live) case: T = batch x 197 rows, live = the stage's kept fraction of T."""
    out = []
    for model, (D, fractions) in MODELS.items():
        for batch in batches:
            T = batch * TOKENS
            for frac in fractions:
                for gemm, (k_mul, n_mul, act, has_res) in GEMMS.items():
                    out.append({"model": model, "batch": batch, "gemm": gemm, "T": T, "live": max(1, round(frac * T)),
                                "K": k_mul * D, "N": n_mul * D, "activation": act, "residual": has_res})  # fmt: skip
    return out


def _tensors(case: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    T, K, N, live = case["T"], case["K"], case["N"], case["live"]
    dev = torch.device("cuda")
    t = {
        "X": torch.randn(T, K, device=dev, generator=g).half(),
        "W": (torch.randn(N, K, device=dev, generator=g) / math.sqrt(K)).half(),
        "Bias": (torch.randn(N, device=dev, generator=g) * 0.1).half(),
        "CuSeqlens": torch.tensor([0, live], device=dev, dtype=torch.int64),
    }
    t["X"][live:] = float("nan")  # dead rows: whatever the buffer held
    if case["residual"]:
        t["Residual"] = torch.randn(T, N, device=dev, generator=g).half()
    return t


def _child(case_list: list[dict[str, Any]], forwards: int) -> list[dict[str, Any]]:
    """Times every case through the op library of RAGGEDVIT_ORT_LIBRARY (this process)."""
    import onnxruntime as ort
    from onnx import TensorProto

    from raggedvit.custom_ops import library_info
    from raggedvit.kernels.reference import ragged_linear_reference
    from raggedvit.runtime import bind_tensor, create_session
    from tests.support.ort_models import linear_model

    build = library_info()["build"]
    lib = {"lib_triton": build.get("triton_version"), "lib_tma": build["linear"]["configs"].get("tma")}
    out = []
    for i, case in enumerate(case_list):
        rec = dict(case) | lib
        try:
            t = _tensors(case, i)
            model = linear_model(TensorProto.FLOAT16, bias=True, residual=case["residual"],
                                 cu_elem=TensorProto.INT64, activation=case["activation"])  # fmt: skip
            sess = create_session(model, "cuda")
            y = torch.full((case["T"], case["N"]), float("nan"), device="cuda", dtype=torch.float16)
            binding = sess.io_binding()
            for name, tensor in t.items():
                bind_tensor(binding, name, tensor)
            bind_tensor(binding, "Y", y, output=True)
            opts = ort.RunOptions()

            def run(sess=sess, binding=binding, opts=opts) -> None:
                sess.run_with_iobinding(binding, opts)

            run()
            torch.cuda.synchronize()
            live = case["live"]
            res = t["Residual"][:live] if "Residual" in t else None
            want = ragged_linear_reference(t["X"][:live], t["W"], t["Bias"], res, None, case["activation"]).float()
            rec["max_abs_err"] = float((y[:live].float() - want).abs().max().item())
            prof = count_kernels(run, forwards=forwards, top=8)
            ours = [k for k in prof["top"] if k["kernel"].startswith(KERNEL_PREFIX)]
            rec["kernel"] = ours[0]["kernel"] if ours else None
            rec["gpu_us"] = sum(k["us_per_forward"] for k in ours) if ours else None
            if rec["max_abs_err"] > 0.05:
                rec["error"] = f"wrong result: max abs err {rec['max_abs_err']}"
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = repr(exc)[:300]
        out.append(rec)
    return out


def _cublas_live(case: dict[str, Any]) -> float:
    t = _tensors(case, 0)
    xl = t["X"][: case["live"]]
    return graph_time_us(lambda: F.linear(xl, t["W"], t["Bias"]), inner=10, reps=7)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--libs", default="", help="NAME=PATH,...: op libraries to time (default: the packaged one)")
    ap.add_argument("--forwards", type=int, default=30)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # internal: JSON file of cases to time here
    args = ap.parse_args()
    if args.child:
        case_list = json.loads(open(args.child).read())
        print(json.dumps(_child(case_list, args.forwards)))
        return
    case_list = cases(tuple(int(b) for b in args.batches.split(",")))
    path = probe_result_path(args.out, "linear_aot")
    libs = [tuple(s.split("=", 1)) for s in args.libs.split(",") if s] or [("packaged", "")]
    data: dict[str, Any] = {"benchmark": "linear_aot", "env": environment(), "libs": dict(libs), "records": []}
    spec = path.with_suffix(".cases.json")
    spec.write_text(json.dumps(case_list))
    for case in case_list:
        data["records"].append({**case, "impl": "cublas_live", "gpu_us": _cublas_live(case)})
    for name, lib in libs:
        env = dict(os.environ)
        if lib:
            env["RAGGEDVIT_ORT_LIBRARY"] = os.path.abspath(lib)
        cmd = [sys.executable, "-m", "benchmarks.linear_aot", "--child", str(spec), "--forwards", str(args.forwards)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
        if proc.returncode or not lines:
            data["records"].append({"impl": name, "error": (proc.stderr or proc.stdout)[-2000:]})
            print(f"{name}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        for rec in json.loads(lines[-1]):
            data["records"].append({**rec, "impl": name})
        path.write_text(json.dumps(data, indent=1))
    spec.unlink()
    totals: dict[tuple[str, int, str], float] = {}
    for r in data["records"]:
        if r.get("gpu_us") is not None and "model" in r:
            key = (r["model"], r["batch"], r["impl"])
            totals[key] = totals.get(key, 0.0) + 3 * r["gpu_us"]  # three blocks per stage
    data["per_forward_us"] = [{"model": m, "batch": b, "impl": i, "us": round(v, 1)} for (m, b, i), v in totals.items()]
    for row in data["per_forward_us"]:
        print("per forward (9 ragged blocks):", row)
    errors = [(r.get("impl"), r.get("model"), r.get("gemm"), r["error"][:120]) for r in data["records"] if "error" in r]
    print("errors:", errors)
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
