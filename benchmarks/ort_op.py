"""Per-op cost of com.raggedvit::RaggedAttention vs com.microsoft::PackedMultiHeadAttention inside ORT graphs (GPU).

    python3 -m benchmarks.ort_op [--out benchmarks/results] [--runs 100]

For every (B, L) and length mode (uniform: all L; ragged: random lengths in [1, L], fixed seed), builds
graphs of n = 1 and n = 12 chained blocks `attention -> glue` where glue maps out [T, H*D] back to the
next attention input with identical work for both ops (Concat of three copies + Reshape: [T, 3*H*D] for
RaggedAttention, [T, H, 3, D] for PackedMultiHeadAttention's packed qkv). Per-op cost = (t12 - t1) / 11;
a glue-only chain gives the glue's share, subtracted in the `net` columns. fp16, H = 12, D = 64,
io binding with data on the GPU, median of --runs runs after warm-up. Writes ort_op_<gpu>.json and
.png under --out (overwritten in place) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from benchmarks.env import result_path
from raggedvit.runtime import create_session
from raggedvit.timing import measure

RESULTS = Path(__file__).resolve().parent / "results"

H, D = 12, 64
SHAPES = [(1, 197), (1, 40), (32, 197), (32, 40), (128, 197), (128, 99), (128, 40)]
VARIANTS = ("ragged", "packed_mha", "glue_only")


def lengths_for(B: int, L: int, mode: str, rng: np.random.Generator) -> np.ndarray:
    return np.full(B, L, np.int32) if mode == "uniform" else rng.integers(1, L + 1, B).astype(np.int32)


def token_offset(lengths: np.ndarray) -> np.ndarray:
    """[B, S] int32: padded positions b*S+s of the real tokens in packed order, then of the padding slots."""
    B, S = len(lengths), int(lengths.max())
    pos = np.arange(B * S, dtype=np.int32).reshape(B, S)
    valid = np.arange(S)[None, :] < lengths[:, None]
    return np.concatenate([pos[valid], pos[~valid]]).reshape(B, S).astype(np.int32)


def build_model(variant: str, n: int) -> bytes:
    """n blocks of attention + glue on qkv [T, 3HD] (ragged/glue_only) or [T, H, 3, D] (packed_mha)."""
    nodes, inits = [], []
    shape_qkv = np.array([-1, 3 * H * D] if variant != "packed_mha" else [-1, H, 3, D], np.int64)
    inits.append(helper.make_tensor("shape_qkv", TensorProto.INT64, [len(shape_qkv)], shape_qkv))
    inits.append(helper.make_tensor("shape_heads", TensorProto.INT64, [4], [-1, H, 1, D]))
    x = "qkv"
    for i in range(n):
        out = f"o{i}"
        if variant == "ragged":
            nodes.append(
                helper.make_node("RaggedAttention", [x, "cu_seqlens"], [out], domain="com.raggedvit", num_heads=H)
            )
        elif variant == "packed_mha":
            nodes.append(
                helper.make_node(
                    "PackedMultiHeadAttention",
                    [x, "", "", "", "token_offset", "cu_seqlens"],
                    [out],
                    domain="com.microsoft",
                    num_heads=H,
                )
            )
        else:  # glue only: take the q block as "out"
            nodes.append(helper.make_node("Slice", [x, "s0", "s1", "s_axis"], [out]))
        if variant == "packed_mha":  # out [T, H*D] -> [T, H, 1, D] x3 -> [T, H, 3, D]
            nodes.append(helper.make_node("Reshape", [out, "shape_heads"], [f"h{i}"]))
            nodes.append(helper.make_node("Concat", [f"h{i}"] * 3, [f"c{i}"], axis=2))
        else:  # out [T, H*D] -> [T, 3*H*D]
            nodes.append(helper.make_node("Concat", [out] * 3, [f"c{i}"], axis=1))
        nodes.append(helper.make_node("Reshape", [f"c{i}", "shape_qkv"], [f"x{i + 1}"]))
        x = f"x{i + 1}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    if variant == "glue_only":
        inits += [
            helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
            helper.make_tensor("s1", TensorProto.INT64, [1], [H * D]),
            helper.make_tensor("s_axis", TensorProto.INT64, [1], [1]),
        ]
    qkv_dims = ["T", 3 * H * D] if variant != "packed_mha" else ["T", H, 3, D]
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT16, qkv_dims),
        helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["B1"]),
    ]
    if variant == "packed_mha":
        inputs.append(helper.make_tensor_value_info("token_offset", TensorProto.INT32, ["B", "S"]))
    graph = helper.make_graph(
        nodes,
        f"{variant}_{n}",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        initializer=inits,
    )
    opsets = [
        helper.make_opsetid("", 17),
        helper.make_opsetid("com.raggedvit", 1),
        helper.make_opsetid("com.microsoft", 1),
    ]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def time_model(variant: str, n: int, feeds: dict[str, np.ndarray], runs: int, warmup: int) -> float:
    """Median seconds of one run of the n-block graph (io binding, inputs and output on the GPU)."""
    sess = create_session(build_model(variant, n), "cuda", disable_cpu_fallback=True)
    binding = sess.io_binding()
    names = {i.name for i in sess.get_inputs()}
    for name, arr in feeds.items():
        if name in names:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0))
    binding.bind_output("y", "cuda")
    # run_with_iobinding synchronises the CUDA stream before returning: no sync around the runs
    t = measure(lambda: sess.run_with_iobinding(binding), lambda: None, warmup_s=0.0, min_warmup=warmup, runs=runs)
    return t.median_ms / 1e3


def gpu_name() -> str:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, mode in zip(axes, ("uniform", "ragged")):
        sel = [r for r in rows if r["mode"] == mode]
        x = np.arange(len(sel))
        ax.bar(x - 0.2, [r["ragged_net_us"] for r in sel], 0.4, label="RaggedAttention (Triton AOT)")
        ax.bar(x + 0.2, [r["packed_mha_net_us"] for r in sel], 0.4, label="PackedMultiHeadAttention")
        ax.set_xticks(x, [f"B={r['B']}\nL={r['L']}" for r in sel])
        ax.set_title(f"{mode} lengths (fp16, H={H}, D={D})")
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("per-op cost in an ORT graph, µs (net of glue)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for mode in ("uniform", "ragged"):
        for B, L in SHAPES:
            lengths = lengths_for(B, L, mode, rng)
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            T = int(cu[-1])
            qkv = (rng.standard_normal((T, 3, H, D)) * 0.5).astype(np.float16)
            feeds = {"cu_seqlens": cu, "token_offset": token_offset(lengths)}
            row: dict = {"mode": mode, "B": B, "L": L, "T": T}
            for variant in VARIANTS:
                data = qkv.transpose(0, 2, 1, 3).copy() if variant == "packed_mha" else qkv.reshape(T, -1)
                t = {n: time_model(variant, n, {**feeds, "qkv": data}, args.runs, args.warmup) for n in (1, 12)}
                row[f"{variant}_t1_us"] = t[1] * 1e6
                row[f"{variant}_t12_us"] = t[12] * 1e6
                row[f"{variant}_per_op_us"] = (t[12] - t[1]) / 11 * 1e6
            for variant in ("ragged", "packed_mha"):
                row[f"{variant}_net_us"] = row[f"{variant}_per_op_us"] - row["glue_only_per_op_us"]
            rows.append(row)
            print(
                f"{mode:8s} B={B:4d} L={L:4d} T={T:6d}  ragged {row['ragged_per_op_us']:8.1f} us  "
                f"packed_mha {row['packed_mha_per_op_us']:8.1f} us  glue {row['glue_only_per_op_us']:7.1f} us",
                flush=True,
            )
    result = {
        "gpu": gpu_name(),
        "onnxruntime": ort.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "dtype": "float16",
        "H": H,
        "D": D,
        "runs": args.runs,
        "warmup": args.warmup,
        "seed": args.seed,
        "method": "per-op = (t12 - t1) / 11 with chained attention+glue blocks; net = per-op - glue-only per-op "
        "(glue-only replaces attention by a Slice of q, a T*H*D copy, so net slightly underestimates)",
        "rows": rows,
    }
    json_path = result_path(args.out, "ort_op", result["gpu"])
    png_path = result_path(args.out, "ort_op", result["gpu"], ".png")
    json_path.write_text(json.dumps(result, indent=1))
    plot(rows, png_path)
    print(f"\n{result['gpu']}, onnxruntime {result['onnxruntime']} — per-op µs inside ORT graphs (net of glue)")
    print(f"{'mode':8s} {'B':>4s} {'L':>4s} {'T':>6s} {'Ragged':>9s} {'PackedMHA':>10s} {'speedup':>8s}")
    for r in rows:
        sp = r["packed_mha_net_us"] / r["ragged_net_us"] if r["ragged_net_us"] > 0 else float("nan")
        print(
            f"{r['mode']:8s} {r['B']:4d} {r['L']:4d} {r['T']:6d} {r['ragged_net_us']:9.1f} "
            f"{r['packed_mha_net_us']:10.1f} {sp:7.2f}x"
        )
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
