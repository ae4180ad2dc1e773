"""Where the time goes in one ORT model: ORT's own profile (per op type and per graph section) and, on CUDA,
a torch.profiler (CUPTI) trace of the GPU kernels the session launches."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["count_kernels", "kernel_summary", "section_of", "summarize_ort_profile"]

_SECTIONS = {
    "attention": ("RaggedAttention", "MultiHeadAttention", "PackedMultiHeadAttention", "Attention"),
    "gemm": ("MatMul", "Gemm", "FusedMatMul", "Conv", "RaggedLinear", "PatchEmbed"),
    "norm": ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "GatherLayerNorm"),
    "activation": ("BiasGelu", "Gelu", "FastGelu", "QuickGelu"),
    "prune_stage": (
        "RaggedSelect",
        "TopK",
        "NonZero",
        "ScatterElements",
        "ScatterND",
        "CumSum",
        "GatherND",
        "ReduceSum",
    ),
}


def section_of(op_type: str) -> str:
    """Section of a node by its op type (traced graphs name nodes after torch ops, not after the model):
    'RaggedAttention' -> 'attention', 'MatMul' -> 'gemm', 'SkipLayerNormalization' -> 'norm', 'BiasGelu' ->
    'activation', 'TopK' -> 'prune_stage'; the rest (casts, gathers, shape arithmetic) -> 'other'."""
    for section, ops in _SECTIONS.items():
        if op_type in ops:
            return section
    return "other"


def summarize_ort_profile(path: str | Path, *, skip_runs: int, top: int = 25) -> dict[str, Any]:
    """Per-run node time of an ORT profile (the runs after the first `skip_runs` model_run events).

    Node times are host-side durations of each kernel's Compute: exact on the CPU EP; on the CUDA EP kernels
    launch asynchronously, so a node's time is its launch cost unless it synchronizes (see kernel_summary).
    """
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[skip_runs:]
    if not runs:
        return {"runs": 0, "error": "no timed model_run events in the profile"}
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    by_op: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    by_section: dict[str, float] = defaultdict(float)
    node_total = 0.0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not any(lo <= e["ts"] <= hi for lo, hi in windows):
            continue
        args = e.get("args", {})
        key = (args.get("op_name", "?"), args.get("provider", "?").replace("ExecutionProvider", ""))
        by_op[key][0] += e["dur"]
        by_op[key][1] += 1
        by_section[section_of(key[0])] += e["dur"]
        node_total += e["dur"]
    n = len(runs)
    ops = [
        {
            "op_type": op,
            "provider": prov,
            "us_per_run": round(total / n, 1),
            "calls_per_run": round(calls / n, 1),
            "share": round(total / node_total, 4) if node_total else None,
        }
        for (op, prov), (total, calls) in sorted(by_op.items(), key=lambda kv: -kv[1][0])
    ]
    return {
        "runs": n,
        "model_run_ms": round(statistics.median(r["dur"] for r in runs) / 1e3, 4),
        "node_ms_per_run": round(node_total / n / 1e3, 4),
        "ops": ops[:top],
        "sections_us_per_run": {k: round(v / n, 1) for k, v in sorted(by_section.items(), key=lambda kv: -kv[1])},
        "note": "host-side node durations (CUDA EP kernels are asynchronous: launch cost unless they sync)",
    }


def kernel_summary(run: Callable[[], None], *, runs: int = 10, top: int = 20) -> dict[str, Any]:
    """GPU kernel time per kernel name over `runs` calls of `run` (torch.profiler with CUPTI sees ORT's kernels
    too); kernels grouped into coarse categories."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = getattr(ev, "self_cuda_time_total", 0.0)
        if us and us > 0:
            rows.append((ev.key, float(us), int(ev.count)))
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    cats: dict[str, float] = defaultdict(float)
    for name, us, _ in rows:
        cats[_kernel_category(name)] += us
    return {
        "runs": runs,
        "gpu_ms_per_run": round(total / runs / 1e3, 4),
        "categories_us_per_run": {k: round(v / runs, 1) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "kernels": [
            {"kernel": name[:120], "us_per_run": round(us / runs, 1), "calls_per_run": round(c / runs, 1)}
            for name, us, c in rows[:top]
        ],
    }


def count_kernels(run: Callable[[], None], *, forwards: int = 10, top: int = 25) -> dict[str, Any]:
    """CUDA work of one forward: `forwards` calls of `run` under torch.profiler (CUPTI traces ONNX Runtime's kernels
    and the kernels of CUDA-graph replays too), after one untraced call.

    Returns kernels_per_forward (kernel launches, memcpy/memset excluded), copies_per_forward (memcpy and memset),
    gpu_us_per_forward (summed durations of both, overlap counted twice) and the `top` kernels by total time.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            run()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = [e for e in events if e.name.startswith(("Memcpy", "Memset"))]
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in events:
        by_name[e.name].append(e.device_time)
    rows = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)
    return {
        "forwards": forwards,
        "kernels_per_forward": (len(events) - len(copies)) / forwards,
        "copies_per_forward": len(copies) / forwards,
        "gpu_us_per_forward": sum(e.device_time for e in events) / forwards,
        "top": [
            {"kernel": k[:160], "us_per_forward": t / forwards, "calls_per_forward": n / forwards}
            for t, n, k in rows[:top]
        ],
    }


_CATEGORIES = (
    ("gemm", ("_ragged_linear", "_patch_embed")),  # raggedvit's GEMM kernels (before "ragged": attention)
    ("ragged_attention", ("ragged",)),
    ("attention_other", ("fmha", "flash", "attention", "softmax")),
    ("gemm", ("gemm", "cutlass", "sm90", "sm80", "xmma", "cublas", "matmul", "ampere", "hopper")),
    ("layernorm", ("layernorm", "layer_norm", "skiplayernorm")),
    ("gelu", ("gelu",)),
    ("conv", ("conv", "im2col", "implicit")),
    ("topk_sort", ("topk", "sort", "radix", "scan", "cub")),
    ("copy_cast", ("copy", "cast", "transpose", "memcpy", "memset", "concat", "slice", "gather", "scatter")),
    ("elementwise", ("elementwise", "binary", "unary", "reduce", "add", "mul", "where")),
)


def _kernel_category(name: str) -> str:
    low = name.lower()
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"
