"""The persistent TMA ragged linear kernel (`_ragged_linear_tma`) against the pointer kernel and cuBLAS, over the
capacity layouts of a cls-mass 0.9@3,6,9 export at serving batch sizes.

    python3 -m benchmarks.linear_persistent [--out benchmarks/results] [--batches 32,128]

For deit_base's and deit_small's four block GEMMs (fp16, nn.Linear weights, the op's epilogues: GELU after fc1,
the residual after proj and fc2), a capacity of B x 197 rows and the live rows after each cls-mass stage (the
sample photos' kept fractions of serving run18: deit_base 0.45 / 0.24 / 0.14, deit_small 0.63 / 0.38 / 0.28), it
times with CUDA-graph replays:

- `cublas_capacity`: F.linear over every row (what the capacity export's MatMul runs), `cublas_live`: over the live
  rows only (a floor no static graph reaches);
- `pointer`: `_ragged_linear` under the pointer-kernel rule (`linear_config(..., tma=False)`), the kernel every
  export ran before;
- `tma_<tiles>`: `_ragged_linear_tma` with each candidate tile config, and `shipped`: `linear_config`'s pick.

Every Triton result is checked against `ragged_linear_reference` over the live rows (the dead rows of a
NaN-poisoned output past the last live tile must stay NaN). Writes linear_persistent_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._linear_config import LinearConfig, first_unwritten_row, linear_config
from raggedvit.kernels._linear_launch import _launch_linear
from raggedvit.kernels.reference import ragged_linear_reference

TOKENS = 197
# model -> (D, live fraction of the capacity after each cls-mass stage)
MODELS = {"base": (768, (0.45, 0.24, 0.14)), "small": (384, (0.63, 0.38, 0.28))}
GEMMS = {"qkv": (1, 3, 0, False), "proj": (1, 1, 0, True), "fc1": (1, 4, 1, False), "fc2": (4, 1, 0, True)}
CANDIDATES = [
    LinearConfig(128, 128, 64, 8, 4, tma=True),
    # several programs per SM (their shared memory fits together: 106.5 / 82 / 65.5 / 49 KiB each), so one's
    # epilogue overlaps another's K loop
    LinearConfig(64, 128, 64, 4, 3, tma=True, programs_per_sm=2),
    LinearConfig(64, 128, 64, 4, 2, tma=True, programs_per_sm=2),
    LinearConfig(64, 128, 64, 8, 3, tma=True, programs_per_sm=2),
    LinearConfig(64, 64, 64, 4, 3, tma=True, programs_per_sm=3),
    LinearConfig(64, 64, 64, 4, 2, tma=True, programs_per_sm=4),
]


def _name(c: LinearConfig) -> str:
    return f"tma_{c.block_m}x{c.block_n}x{c.block_k}_w{c.num_warps}_s{c.num_stages}_p{c.programs_per_sm}"


class Draw(NamedTuple):
    """Operands of one block GEMM over T capacity rows (the first `live` live; dead rows of x are NaN): x [T, K],
    w [N, K], b [N], res [T, N] or None, cu [0, live] int32, y [T, N] (the output buffer), act, and want [live, N]
    float32 (`ragged_linear_reference` over the live rows)."""

    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    res: torch.Tensor | None
    cu: torch.Tensor
    y: torch.Tensor
    act: int
    want: torch.Tensor


def draw(model: str, gemm: str, T: int, live: int) -> Draw:
    """The operands of GEMMS[gemm] of MODELS[model] from torch's global generator (the probes' recorded draws)."""
    D = MODELS[model][0]
    k_mul, n_mul, act, has_res = GEMMS[gemm]
    K, N = k_mul * D, n_mul * D
    dev = torch.device("cuda")
    w = (torch.randn(N, K, device=dev) / math.sqrt(K)).half()
    b = (torch.randn(N, device=dev) * 0.1).half()
    x = torch.randn(T, K, device=dev).half()
    x[live:] = float("nan")  # dead rows: whatever the buffer held
    res = torch.randn(T, N, device=dev).half() if has_res else None
    cu = torch.tensor([0, live], device=dev, dtype=torch.int32)
    y = torch.empty(T, N, device=dev, dtype=torch.float16)
    want = ragged_linear_reference(x[:live], w, b, None if res is None else res[:live], cu, act).float()
    return Draw(x, w, b, res, cu, y, act, want)


def _case(model: str, gemm: str, T: int, live: int, arch: int) -> list[dict[str, Any]]:
    x, w, b, res, cu, y, act, want = draw(model, gemm, T, live)
    K, N = x.shape[1], w.shape[0]
    xl = x[:live]
    configs = {"pointer": linear_config(T, N, arch, True, tma=False), "shipped": linear_config(T, N, arch, True)}
    configs.update({_name(c): c for c in CANDIDATES})
    fns: dict[str, Callable[[], Any]] = {
        "cublas_capacity": lambda: F.linear(x, w, b),
        "cublas_live": lambda: F.linear(xl, w, b),
    }
    for name, c in configs.items():
        fns[name] = lambda c=c: _launch_linear(x, w, b, res, cu, act, config=c, out=y)
    base = {"model": model, "gemm": gemm, "T": T, "live": live, "K": K, "N": N,
            "shipped_config": repr(configs["shipped"])}  # fmt: skip
    return time_checked(fns, base, y, live, want, lambda impl: first_unwritten_row(configs[impl], live))


def time_checked(
    fns: dict[str, Callable[[], Any]],
    base: dict[str, Any],
    y: torch.Tensor,
    live: int,
    want: torch.Tensor,
    unwritten_from: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """One record per implementation: each writes into y [T, N] (NaN-poisoned first); all but the cuBLAS peers
    (names "cublas*", not checked) must match `want` over the live rows (max abs error < 0.05) and, with
    `unwritten_from(impl)`, leave every row from there on NaN; then CUDA-graph replays time it (gpu_us)."""
    records = []
    for impl, fn in fns.items():
        rec: dict[str, Any] = {**base, "impl": impl}
        try:
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if not impl.startswith("cublas"):
                err = (y[:live].float() - want).abs().max().item() if live else 0.0
                rec["max_abs_err"] = err
                ok, why = err < 0.05, f"max abs err {err}"
                if unwritten_from is not None:
                    dead_nan = bool(torch.isnan(y[unwritten_from(impl) :]).all().item())
                    rec["dead_rows_untouched"] = dead_nan
                    ok, why = ok and dead_nan, f"{why}, dead rows untouched {dead_nan}"
                if not ok:
                    rec["error"] = f"wrong result: {why}"
                    records.append(rec)
                    continue
            rec["gpu_us"] = graph_time_us(fn, inner=10, reps=7)[0]
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = repr(exc)[:400]
        records.append(rec)
    return records


def run_cases(
    name: str, case: Callable[[str, str, int, int], list[dict[str, Any]]], batches: str, out: str,
    best_of: str | None = None, gemms: tuple[str, ...] = tuple(GEMMS), per_gemm: bool = False,
    meta: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Every (model, batch, stage's live fraction, GEMM) case of MODELS x `gemms` (a subset of GEMMS, in that order)
    through `case(model, gemm, T, live)` after torch.manual_seed(0) (the operands of `draw`, in this order);
    prints each case and writes <name>_<date>_<gpu>.json under `out` as it goes, with per_forward_us (3 blocks per
    stage) at the end: per implementation, or per "gemm:implementation" with per_gemm. best_of: a name prefix whose
    fastest implementation each printed case names; meta: more top-level fields of the file."""
    assert set(gemms) <= set(GEMMS), gemms
    path = probe_result_path(out, name)
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": name, "env": environment(), "models": MODELS, **(meta or {}), "records": records}
    totals: dict[tuple[str, int], dict[str, float]] = {}
    for model, (_, fractions) in MODELS.items():
        for batch in (int(b) for b in batches.split(",")):
            T = batch * TOKENS
            for frac in fractions:
                live = max(1, round(frac * T))
                for gemm in gemms:
                    recs = case(model, gemm, T, live)
                    records += recs
                    ok = {r["impl"]: r["gpu_us"] for r in recs if "gpu_us" in r}
                    tot = totals.setdefault((model, batch), {})
                    for impl, us in ok.items():
                        key = f"{gemm}:{impl}" if per_gemm else impl
                        tot[key] = tot.get(key, 0.0) + 3 * us  # three blocks per stage
                    ranked = sorted((v, k) for k, v in ok.items() if best_of is not None and k.startswith(best_of))
                    best = f" best {ranked[0][1]}" if ranked else ""
                    errs = {r["impl"]: r["error"][:120] for r in recs if "error" in r}
                    us = {k: f"{v:.1f}" for k, v in ok.items()}
                    print(f"{model} {gemm} T={T} live={live}: {us}{best} errors {errs}", flush=True)
                    path.write_text(json.dumps(data, indent=1))
    data["per_forward_us"] = [{"model": m, "batch": b, **{k: round(v, 1) for k, v in t.items()}}
                              for (m, b), t in totals.items()]  # fmt: skip
    for row in data["per_forward_us"]:
        print("per forward (9 ragged blocks):", row)
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--batches", default="32,128")
    args = ap.parse_args()
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    run_cases("linear_persistent", lambda m, g, T, live: _case(m, g, T, live, arch), args.batches, args.out, "tma_")


if __name__ == "__main__":
    main()
