"""Benchmark raggedvit's ragged attention against torch peers on one GPU (fp16, H=12, D=64).

raggedvit+key_bias / raggedvit+cls+key_bias: the same op with a per-key bias [T] float32 (tome's proportional
attention, log of token sizes 1..8): its cost over raggedvit / raggedvit+cls is the bias input's.

Two timings per (shape, impl): gpu_us = CUDA-graph replay of N back-to-back calls / N (median of
replays; impls that cannot be captured fall back to triton.testing.do_bench and say so in `note`),
and call_us = host wall time of back-to-back eager calls incl. dispatch (200 calls + synchronize,
/200, median of 5). bytes_floor = (qkv + out bytes) / 4.3 TB/s.

    python3 -m benchmarks.kernel --check               # correctness first, then the full benchmark
    python3 -m benchmarks.kernel --quick               # smoke run
    python3 -m benchmarks.kernel --tune                # also sweep kernel configs on a few shapes

Writes <out>/kernel_<gpu>.json and .png (overwritten in place), and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.env import result_path
from raggedvit.kernels import ragged_attention, ragged_attention_reference
from raggedvit.kernels._config import SMALL_T_LIMIT, KernelConfig, pick_config
from raggedvit.kernels._launch import _launch_triton
from raggedvit.timing import measure
from tests.support.testing import assert_close

H, D, DTYPE = 12, 64, torch.float16
HBM_BYTES_PER_S = 4.3e12


def shapes(quick: bool) -> list[tuple[int, int, str]]:
    """(B, L, lengths kind) to benchmark."""
    if quick:
        return [(1, 197, "uniform"), (32, 99, "ragged"), (128, 197, "uniform")]
    out = [(b, L, kind) for L in (197, 99, 40) for b in (1, 4, 32, 128) for kind in ("uniform", "ragged")]
    return out + [(b, 577, kind) for b in (1, 32) for kind in ("uniform", "ragged")]


def make_inputs(B: int, L: int, kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed * 7919 + B * 1000 + L)
    if kind == "uniform":
        lengths = [L] * B
    else:
        lengths = torch.randint(max(1, L // 2), L + 1, (B,), generator=g).tolist()
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    qkv = torch.randn(int(cu[-1]), 3 * H * D, generator=g).to(DTYPE)
    return qkv.cuda(), cu.cuda(), lengths


def key_bias(T: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """[T] float32 log of token sizes 1..8: the key bias tome's proportional attention passes."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 9, (T,), generator=g).float().log().to(device)


# ---------------------------------------------------------------- timing
def graph_time_us(fn: Callable[[], object], inner: int = 20, reps: int = 15) -> tuple[float, str]:
    """Median per-call GPU time of `inner` calls captured in one CUDA graph; do_bench if capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / inner)
        del graph
        return statistics.median(times), ""
    except Exception as exc:  # noqa: BLE001 - any capture failure falls back to do_bench
        torch.cuda.synchronize()
        import triton.testing

        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        return ms * 1e3, f"no graph capture ({type(exc).__name__}): do_bench median"


def call_time_us(fn: Callable[[], object], calls: int = 200, reps: int = 5) -> float:
    """Median over `reps` of host wall time per call of `calls` back-to-back eager calls + one synchronize
    (raggedvit.timing.measure of the `calls` calls; graph_time_us above is GPU time, which measure does not take)."""

    def back_to_back() -> None:
        for _ in range(calls):
            fn()

    t = measure(back_to_back, torch.cuda.synchronize, warmup_s=0.0, min_warmup=1, runs=reps)
    return t.median_ms / calls * 1e3


# ---------------------------------------------------------------- implementations
Peer = Callable[[], object] | tuple[Callable[[], object], str] | str


def peers(qkv: torch.Tensor, cu: torch.Tensor, lengths: list[int]) -> dict[str, Peer]:
    """impl name -> zero-arg callable, (callable, note), or the reason it is unavailable."""
    T = qkv.shape[0]
    B, Lmax = len(lengths), max(lengths)
    uniform = len(set(lengths)) == 1
    kb = key_bias(T, qkv.device)
    impls: dict[str, Peer] = {
        "raggedvit": lambda: ragged_attention(qkv, cu, H),
        "raggedvit+cls": lambda: ragged_attention(qkv, cu, H, return_cls_attn=True),
        "raggedvit+key_bias": lambda: ragged_attention(qkv, cu, H, key_bias=kb),
        "raggedvit+cls+key_bias": lambda: ragged_attention(qkv, cu, H, return_cls_attn=True, key_bias=kb),
    }
    x = qkv.view(T, 3, H, D)
    q, k, v = x.unbind(1)  # each [T, H, D], row stride 3*H*D

    # padded SDPA with key-padding mask: inputs already padded [B, H, Lmax, D] (padding cost not counted)
    try:
        pos = torch.cat([torch.arange(n, device=qkv.device) for n in lengths])
        seq = torch.repeat_interleave(torch.arange(B, device=qkv.device), torch.tensor(lengths, device=qkv.device))
        padded = qkv.new_zeros(B, Lmax, 3, H, D)
        padded[seq, pos] = x
        pq, pk, pv = (t.contiguous() for t in padded.permute(2, 0, 3, 1, 4).unbind(0))
        mask = torch.arange(Lmax, device=qkv.device)[None, :] < torch.tensor(lengths, device=qkv.device)[:, None]
        mask = mask[:, None, None, :]
        impls["padded_sdpa"] = lambda: F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask)
    except Exception as exc:  # noqa: BLE001
        impls["padded_sdpa"] = f"unavailable: {exc!r}"[:200]

    if uniform:  # timm's layout: views of the qkv Linear output, no mask
        dq, dk, dv = qkv.view(B, Lmax, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        impls["dense_sdpa"] = lambda: F.scaled_dot_product_attention(dq, dk, dv)

    impls["varlen_fa"] = _varlen_peer(q, k, v, cu, Lmax)

    impls["nested_sdpa"] = _nested_peer(q, k, v, cu, lengths)
    return impls


def _nested_peer(q, k, v, cu, lengths) -> Callable[[], object] | tuple[Callable[[], object], str] | str:
    """SDPA on jagged NestedTensors [B, j, H, D] -> [B, H, j, D] built from the packed rows in every call."""
    offsets = cu.to(torch.int64)
    lo, hi = min(lengths), max(lengths)

    def make(tq, tk, tv) -> Callable[[], object]:
        def nested() -> torch.Tensor:
            nq, nk, nv = (
                torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)
                for t in (tq, tk, tv)
            )
            return F.scaled_dot_product_attention(nq, nk, nv).transpose(1, 2).values()

        return nested

    try:
        fn = make(q, k, v)
        fn()
        return fn
    except Exception as exc:  # noqa: BLE001 - retry with contiguous q/k/v made outside the timed call
        first = f"{exc!r}"[:120]
    try:
        fn = make(q.contiguous(), k.contiguous(), v.contiguous())
        fn()
        return fn, f"q/k/v made contiguous outside the timed call (strided views failed: {first})"
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc!r}"[:200]


def _varlen_peer(q, k, v, cu, max_len) -> Peer:
    reasons = []
    try:
        from torch.nn.attention.varlen import varlen_attn

        fn = lambda: varlen_attn(q, k, v, cu, cu, max_len, max_len)  # noqa: E731
        fn()
        return fn
    except Exception as exc:  # noqa: BLE001
        reasons.append(f"varlen_attn: {exc!r}"[:160])
    try:
        op = torch.ops.aten._flash_attention_forward
        fn = lambda: op(q, k, v, cu, cu, max_len, max_len, 0.0, False, False)  # noqa: E731
        fn()
        return fn
    except Exception as exc:  # noqa: BLE001
        reasons.append(f"_flash_attention_forward: {exc!r}"[:160])
    return "unavailable: " + "; ".join(reasons)


# ---------------------------------------------------------------- check / tune
def check(shape_list: list[tuple[int, int, str]]) -> None:
    """Our op (lean path, called twice so the cached fast launch runs) vs the float64 reference."""
    for B, L, kind in shape_list:
        qkv, cu, lengths = make_inputs(B, L, kind)
        for kb in (None, key_bias(qkv.shape[0], qkv.device)):
            ref_out, ref_cls = ragged_attention_reference(
                qkv, cu, H, return_cls_attn=True, compute_dtype=torch.float64, key_bias=kb
            )
            for attempt in range(2):
                out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True, key_bias=kb)
                out2 = ragged_attention(qkv, cu, H, key_bias=kb)
                torch.cuda.synchronize()
                name = f"B={B} L={L} {kind}{' key_bias' if kb is not None else ''} call {attempt}"
                assert_close(out, ref_out.to(DTYPE), name=f"{name} out")
                assert_close(out2, ref_out.to(DTYPE), name=f"{name} out (no cls)")
                assert_close(cls_attn, ref_cls.float(), name=f"{name} cls_attn")
    print(f"check: raggedvit (with and without a key bias) matches the float64 reference on {len(shape_list)} shapes")


TUNE_SHAPES = [(1, 197), (4, 197), (32, 197), (128, 197), (128, 99), (32, 577)]


def tune_variants(quick: bool) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of _ragged_attn_fwd to time."""
    bms, bns, warps, stages = ((32, 64, 128), (32, 64), (4, 8), (2, 3))
    out = [(bm, bn, w, st) for bm in bms for bn in bns for w in warps for st in stages]
    if quick:  # 8 warps only for 128-row tiles, 4 warps for the rest
        out = [c for c in out if (c[2] == 8) == (c[0] == 128)]
    return out


def _time_fwd(qkv, cu, cfg: KernelConfig, cls: bool) -> float | None:
    fn = lambda: _launch_triton(qkv, cu, H, D**-0.5, cls, config=cfg)  # noqa: E731
    try:
        return graph_time_us(fn, inner=10, reps=7)[0]
    except Exception as exc:  # noqa: BLE001 - out of resources etc.
        print(f"tune {cfg}: {exc!r}"[:200])
        return None


def _pick(rows: list[dict], shapes_: list[tuple[int, int]], key: str) -> tuple | None:
    """Variant with the lowest geometric mean of time / best-time over `shapes_` (must run on all)."""
    best = {sh: min(r["gpu_us"] for r in rows if (r["B"], r["L"]) == sh) for sh in shapes_}
    score: dict[tuple, float] = {}
    for variant in dict.fromkeys(r[key] for r in rows):
        rel = [r["gpu_us"] / best[(r["B"], r["L"])] for r in rows if r[key] == variant and (r["B"], r["L"]) in best]
        if len(rel) == len(shapes_):
            score[variant] = statistics.geometric_mean(rel)
    return min(score, key=score.get) if score else None


def tune(quick: bool) -> list[dict]:
    """Time the fwd kernel over config variants and the cls kernel over (cls_block_n, warps) on TUNE_SHAPES
    (uniform lengths); print the best variant per T regime as a `_TUNED` table for _config.py."""
    base = pick_config(1, D, DTYPE)
    variants = tune_variants(quick)
    cls_variants = [(4, 4), (8, 4), (8, 8), (16, 8)]
    rows: list[dict] = []
    t0 = time.time()
    for B, L in TUNE_SHAPES:
        qkv, cu, _ = make_inputs(B, L, "uniform")
        T = qkv.shape[0]
        for bm, bn, w, st in variants:
            us = _time_fwd(qkv, cu, KernelConfig("fp16", base.block_d, bm, bn, w, st, base.cls_block_n, 4), False)
            if us is not None:
                rows.append({"B": B, "L": L, "T": T, "kernel": "fwd", "variant": (bm, bn, w, st), "gpu_us": us})
        fwd_cfg = pick_config(T, D, DTYPE)
        for cbn, cw in cls_variants:  # fwd(store_lse) + cls: differences between variants are the cls kernel's
            cfg = KernelConfig("fp16", base.block_d, fwd_cfg.block_m, fwd_cfg.block_n, fwd_cfg.num_warps,
                               fwd_cfg.num_stages, cbn, cw, cls_heads=fwd_cfg.cls_heads)  # fmt: skip
            us = _time_fwd(qkv, cu, cfg, True)
            if us is not None:
                rows.append({"B": B, "L": L, "T": T, "kernel": "fwd+cls", "variant": (cbn, cw), "gpu_us": us})
        sel = sorted((r for r in rows if (r["B"], r["L"], r["kernel"]) == (B, L, "fwd")), key=lambda r: r["gpu_us"])
        now = (fwd_cfg.block_m, fwd_cfg.block_n, fwd_cfg.num_warps, fwd_cfg.num_stages)
        cur = next((f"{r['gpu_us']:.1f}" for r in sel if r["variant"] == now), "-")
        top = ", ".join(f"{r['gpu_us']:.1f} us {r['variant']}" for r in sel[:3])
        print(f"tune B={B} L={L} T={T}: fwd best {top}; current {now} {cur} us ({time.time() - t0:.0f} s)")
    lines = []
    for regime, small in (("small", True), ("large", False)):
        sh = [(B, L) for B, L in TUNE_SHAPES if (B * L < SMALL_T_LIMIT) == small]
        fwd = _pick([r for r in rows if r["kernel"] == "fwd"], sh, "variant")
        cls = _pick([r for r in rows if r["kernel"] == "fwd+cls"], sh, "variant")
        if fwd is not None and cls is not None:
            lines.append(f'    ("fp16", {base.block_d}, "{regime}"): {tuple(fwd) + tuple(cls)},  # shapes {sh}')
    print("# ready to paste into raggedvit/kernels/_config.py (fp16 measured; bf16 untested):")
    print("_TUNED: dict[tuple[str, int, str], tuple[int, ...]] = {\n" + "\n".join(lines) + "\n}")
    return rows


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results", help="output directory (default: benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help="3 shapes, fewer repetitions")
    ap.add_argument("--check", action="store_true", help="verify correctness vs the reference first")
    ap.add_argument("--tune", action="store_true", help="also sweep kernel configs (adds ~1-2 min)")
    ap.add_argument("--quick-tune", action="store_true", help="--tune over a smaller variant subset")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.kernel needs a CUDA GPU")
    shape_list = shapes(args.quick)
    if args.check:
        check(shape_list)
    import triton

    gpu = torch.cuda.get_device_name()
    calls = 50 if args.quick else 200
    records = []
    t_start = time.time()
    for B, L, kind in shape_list:
        qkv, cu, lengths = make_inputs(B, L, kind)
        T = qkv.shape[0]
        floor = (qkv.numel() + T * H * D) * qkv.element_size() / HBM_BYTES_PER_S * 1e6
        base = {"B": B, "L": L, "lengths": kind, "T": T}
        records.append(
            {**base, "impl": "bytes_floor", "gpu_us": floor, "call_us": None, "note": "(q,k,v,o) / 4.3 TB/s"}
        )
        for name, fn in peers(qkv, cu, lengths).items():
            if isinstance(fn, str):
                records.append({**base, "impl": name, "gpu_us": None, "call_us": None, "note": fn})
                continue
            fn, peer_note = fn if isinstance(fn, tuple) else (fn, "")
            if name.startswith("raggedvit"):
                cfg = pick_config(T, D, DTYPE)
                peer_note = f"BLOCK_M={cfg.block_m} BLOCK_N={cfg.block_n} warps={cfg.num_warps} stages={cfg.num_stages}"
            try:
                gpu_us, note = graph_time_us(fn)
                note = "; ".join(n for n in (peer_note, note) if n)
                n_calls = 10 if name.startswith("nested") else calls  # NestedTensor SDPA: ~5 ms per call
                call_us = call_time_us(fn, calls=n_calls, reps=3 if args.quick else 5)
            except Exception as exc:  # noqa: BLE001
                gpu_us, call_us, note = None, None, f"failed: {exc!r}"[:200]
            records.append({**base, "impl": name, "gpu_us": gpu_us, "call_us": call_us, "note": note})
    tuned = tune(args.quick_tune) if (args.tune or args.quick_tune) else []
    meta = {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "dtype": "float16",
        "H": H,
        "D": D,
        "configs": [pick_config(t, D, DTYPE).as_dict() for t in (1, SMALL_T_LIMIT)],
        "seconds": round(time.time() - t_start, 1),
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = result_path(out_dir, "kernel", gpu), result_path(out_dir, "kernel", gpu, ".png")
    json_path.write_text(json.dumps({**meta, "records": records, "tune": tuned}, indent=1))
    print_table(records)
    plot(records, png_path, gpu)
    print(f"wrote {json_path} and {png_path} ({meta['seconds']} s)")


def print_table(records: list[dict]) -> None:
    impls = list(dict.fromkeys(r["impl"] for r in records))
    print("gpu_us/call_us per impl (- = unavailable)")
    print(f"{'B':>4} {'L':>4} {'kind':<8} " + " ".join(f"{i:>16}" for i in impls))
    rows: dict[tuple, dict[str, str]] = {}
    for r in records:
        g = "-" if r["gpu_us"] is None else f"{r['gpu_us']:.1f}"
        c = "" if r["call_us"] is None else f"/{r['call_us']:.0f}"
        rows.setdefault((r["B"], r["L"], r["lengths"]), {})[r["impl"]] = g + c
    for (B, L, kind), cells in rows.items():
        print(f"{B:>4} {L:>4} {kind:<8} " + " ".join(f"{cells.get(i, ''):>16}" for i in impls))
    for r in records:
        if r["note"] and r["impl"] != "bytes_floor":
            print(f"note B={r['B']} L={r['L']} {r['lengths']} {r['impl']}: {r['note']}")


def plot(records: list[dict], path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls = sorted({r["L"] for r in records})
    kinds = ["uniform", "ragged"]
    fig, axes = plt.subplots(len(Ls), 2, figsize=(11, 3.2 * len(Ls)), squeeze=False)
    for i, L in enumerate(Ls):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            sel = [r for r in records if r["L"] == L and r["lengths"] == kind and r["gpu_us"] is not None]
            for impl in dict.fromkeys(r["impl"] for r in sel):
                pts = sorted((r["B"], r["gpu_us"]) for r in sel if r["impl"] == impl)
                style = "k--" if impl == "bytes_floor" else "o-"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"L={L} {kind}")
            ax.set_xlabel("B")
            ax.set_ylabel("GPU us / call")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"ragged attention fp16 H={H} D={D} on {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
