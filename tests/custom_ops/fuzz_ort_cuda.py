"""Fuzz com.raggedvit::RaggedAttention on ORT's CUDA EP (test_sanitized_fuzz_gpu.py runs it, alone and under
compute-sanitizer); from the checkout's root:

    python3 -m tests.custom_ops.fuzz_ort_cuda --calls 1000 --out /tmp/fuzz

Random T (0 included), H, D in {32, 64, 80, 128}, dtypes, cu dtypes, cls_attn on/off; valid cu_seqlens
(checked against the float64 reference) and invalid ones (decreasing, > T, negative, last != T: must
not fault; the kernel clamps them). A third of the calls add the relative position bias (pos_table, token_pos;
grids and prefixes of POS_GRIDS) with out-of-range token_pos values (class rows: checked like the others), and
some of those a pos_table or token_pos of the wrong shape (must be refused with an error naming it).
Every session sets session.disable_cpu_ep_fallback=1.
Writes fuzz.json (counts, failures, seed) under --out and prints a summary; exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from onnx import TensorProto

from raggedvit.kernels.reference import pos_table_size, ragged_attention_reference
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import attention_model
from tests.support.testing import rel_error

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CU_DTYPES = (torch.int32, torch.int64)
HEAD_DIMS = (32, 64, 80, 128)
HEADS = (1, 3, 12)  # few values: one session per (dtype, cu dtype, H, cls) keeps sanitized runs short
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}
BAD_KINDS = ("decreasing", "above_T", "negative", "last_not_T")
POS_GRIDS = (((14, 14), 1), ((7, 9), 0), ((1, 1), 2), ((16, 16), 1))  # (grid, num_prefix)
BAD_POS = ("table_cols", "table_rows", "token_pos_short", "token_pos_long")


def draw_token_pos(rng: random.Random, T: int, grid: tuple[int, int], p: int, cu_dtype: torch.dtype) -> torch.Tensor:
    """[T] original token indices: mostly in the grid, some out of range (negative, past the grid, dtype limits)."""
    info = torch.iinfo(cu_dtype)
    odd = (-1, p + grid[0] * grid[1], info.max, info.min, -(2**20))
    n = p + grid[0] * grid[1]
    values = [rng.choice(odd) if rng.random() < 0.1 else rng.randrange(n) for _ in range(T)]
    return torch.tensor(values, dtype=torch.int64).to(cu_dtype)


def valid_cu(rng: random.Random, T: int) -> list[int]:
    B = rng.randint(1, 12)
    cuts = sorted(rng.randint(0, T) for _ in range(B - 1))
    return [0, *cuts, T]


def invalid_cu(rng: random.Random, T: int, kind: str) -> list[int]:
    cu = valid_cu(rng, T)
    i = rng.randrange(len(cu))
    if kind == "decreasing":
        cu = cu[:1] + sorted(cu[1:], reverse=True) if len(cu) > 2 else [0, T + 1, 0]
    elif kind == "above_T":
        cu[i] = T + rng.randint(1, 1 << 20)
    elif kind == "negative":
        cu[i] = -rng.randint(1, 1 << 20)
    else:
        cu[-1] = max(0, T - rng.randint(1, 8)) if T > 0 else 3
    return cu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-t", type=int, default=700)
    ap.add_argument("--out", type=Path, default=Path("fuzz-cuda"), help="folder of fuzz.json")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: smoke-test this script on the CPU EP, where invalid cu_seqlens must raise",
    )
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    sessions: dict[tuple, object] = {}
    counts = {"valid": 0, "invalid": 0, "rejected": 0, "empty": 0, "checked": 0, "with_pos": 0, "bad_pos_refused": 0}
    failures: list[dict] = []
    t0 = time.time()
    for call in range(args.calls):
        dtype, cu_dtype = rng.choice(DTYPES), rng.choice(CU_DTYPES)
        H, D, with_cls = rng.choice(HEADS), rng.choice(HEAD_DIMS), rng.random() < 0.5
        T = 0 if rng.random() < 0.03 else rng.randint(1, args.max_t)
        bad = rng.choice(BAD_KINDS) if rng.random() < 0.4 else None
        cu = invalid_cu(rng, T, bad) if bad else valid_cu(rng, T)
        grid, p = rng.choice(POS_GRIDS) if rng.random() < 0.33 else (None, 0)
        bad_pos = rng.choice(BAD_POS) if grid is not None and rng.random() < 0.1 else None
        key = (dtype, cu_dtype, H, with_cls, grid, p)
        if key not in sessions:
            pos_attrs = {}
            if grid is not None:
                cu_elem = TensorProto.INT32 if cu_dtype == torch.int32 else TensorProto.INT64
                pos_attrs = {"pos_elems": (TensorProto.FLOAT, cu_elem), "grid_h": grid[0], "grid_w": grid[1],
                             "num_prefix": p}  # fmt: skip
            model = attention_model(dtype, cu_dtype, H, cls_attn=with_cls, **pos_attrs)
            sessions[key] = create_session(model, args.device, disable_cpu_fallback=args.device == "cuda")
        qkv = torch.randn(T, 3 * H * D, generator=gen).to(dtype)
        cu_t = torch.tensor(cu, dtype=cu_dtype)
        pos = {}
        if grid is not None:
            R = pos_table_size(grid)
            table_shape = {"table_cols": (H, R - 1), "table_rows": (H + 1, R)}.get(bad_pos, (H, R))
            tp_len = {"token_pos_short": T - 1 if T else 2, "token_pos_long": T + 1}.get(bad_pos, T)
            pos = {"pos_table": torch.randn(table_shape, generator=gen) * 2,
                   "token_pos": draw_token_pos(rng, tp_len, grid, p, cu_dtype)}  # fmt: skip
            counts["with_pos"] += 1
        case = {
            "call": call,
            "dtype": str(dtype),
            "cu_dtype": str(cu_dtype),
            "T": T,
            "H": H,
            "D": D,
            "cls": with_cls,
            "cu": cu if len(cu) < 16 else cu[:16] + ["..."],
            "bad": bad,
            "grid": grid,
            "num_prefix": p,
            "bad_pos": bad_pos,
        }
        out = torch.full((T, H * D), float("nan"), dtype=dtype, device=args.device)
        bound = {"out": out}
        if with_cls:
            bound["cls_attn"] = torch.full((T,), float("nan"), device=args.device)
        try:
            inputs = {"qkv": qkv, "cu_seqlens": cu_t, **pos}
            run_with_iobinding(sessions[key], {k: v.to(args.device) for k, v in inputs.items()}, bound)
            if args.device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001  (every failure is recorded)
            if bad_pos is not None and ("input 'pos_table'" in str(exc) or "input 'token_pos'" in str(exc)):
                counts["bad_pos_refused"] += 1  # the shape checks name the input (on either EP)
            elif args.device == "cpu" and bad is not None and "RaggedAttention: input 'cu_seqlens'" in str(exc):
                counts["rejected"] += 1  # the CPU op validates cu_seqlens values
            else:
                failures.append({**case, "error": str(exc)[:500]})
            continue
        if bad_pos is not None:
            failures.append({**case, "error": f"a bad relative position input ({bad_pos}) was accepted"})
            continue
        if bad is not None and args.device == "cpu":
            failures.append({**case, "error": "the CPU op accepted invalid cu_seqlens"})
            continue
        counts["invalid" if bad else "valid"] += 1
        counts["empty"] += T == 0
        if bad is None and T > 0:
            ref_pos = {**pos, "grid": grid, "num_prefix": p} if pos else {}
            ref, ref_cls = ragged_attention_reference(
                qkv, cu_t, H, return_cls_attn=True, compute_dtype=torch.float64, **ref_pos
            )
            errs = {"out": rel_error(out, ref)}
            if with_cls:
                errs["cls_attn"] = rel_error(bound["cls_attn"], ref_cls)
            counts["checked"] += 1
            bad_errs = {k: v for k, v in errs.items() if not v <= TOL[dtype]}
            if bad_errs:
                failures.append({**case, "error": f"rel errors {bad_errs} above {TOL[dtype]:.1e}"})
    summary = {
        "seed": seed,
        "calls": args.calls,
        **counts,
        "failures": len(failures),
        "seconds": round(time.time() - t0, 1),
        "first_failures": failures[:20],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz.json").write_text(json.dumps(summary, indent=1))
    print(
        f"fuzz: {args.calls} {args.device.upper()}-EP calls (seed {seed}): {counts['valid']} valid "
        f"({counts['checked']} checked vs reference), {counts['invalid']} invalid cu_seqlens run, "
        f"{counts['rejected']} rejected, {counts['empty']} empty, {counts['with_pos']} with relative position bias "
        f"({counts['bad_pos_refused']} bad pos inputs refused); {len(failures)} failures; "
        f"{summary['seconds']} s"
    )
    for f in failures[:5]:
        print("  FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
