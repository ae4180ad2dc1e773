"""One deit_base block GEMM as a probe case, shared by `benchmarks.linear_tune` and `benchmarks.linear_tma`.

`GemmCase.make(name, T, live)` draws the operands of BLOCK_GEMMS[name] on the GPU (fp16; weight in nn.Linear's
[N, K] layout, its transpose [K, N] too), the float32 reference of the ragged linear op over the first `live` rows
(`ragged_linear_reference`), and `peers()` gives the cuBLAS peers: F.linear alone, and followed by the separate
epilogue (GELU / residual add) as ONNX Runtime runs it. `time_impls` checks each implementation against the
reference on a NaN-poisoned output and times it with CUDA-graph replays (benchmarks.kernel.graph_time_us).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.kernel import graph_time_us
from raggedvit.kernels.reference import ragged_linear_reference

__all__ = ["BLOCK_GEMMS", "GemmCase", "time_impls"]

# deit_base's block GEMMs: name -> (K, N, activation (0 none, 1 GELU), residual added)
BLOCK_GEMMS = {"qkv": (768, 2304, 0, False), "proj": (768, 768, 0, True), "fc1": (768, 3072, 1, False),
               "fc2": (3072, 768, 0, True)}  # fmt: skip


@dataclass
class GemmCase:
    """Operands of one GEMM over T rows of which the first `live` are live: x [T, K], w [N, K], wt [K, N], b [N],
    res [T, N], y [T, N] (the output buffer), cu [0, live] int32, want [T, N] float32."""

    name: str
    T: int
    live: int
    K: int
    N: int
    act: int
    has_res: bool
    x: torch.Tensor
    w: torch.Tensor
    wt: torch.Tensor
    b: torch.Tensor
    res: torch.Tensor
    y: torch.Tensor
    cu: torch.Tensor
    want: torch.Tensor

    @classmethod
    def make(cls, name: str, T: int, live: int, shape: tuple[int, int, int, bool] | None = None) -> GemmCase:
        """BLOCK_GEMMS[name], or `shape` = (K, N, activation, residual added) under that name."""
        K, N, act, has_res = BLOCK_GEMMS[name] if shape is None else shape
        dev = torch.device("cuda")
        w = (torch.randn(N, K, device=dev) / math.sqrt(K)).half()
        b = (torch.randn(N, device=dev) * 0.1).half()
        x = torch.randn(T, K, device=dev).half()
        res = torch.randn(T, N, device=dev).half()
        cu = torch.tensor([0, live], device=dev, dtype=torch.int32)
        want = ragged_linear_reference(x, w, b, res if has_res else None, cu, act).float()
        y = torch.empty(T, N, device=dev, dtype=torch.float16)
        return cls(name, T, live, K, N, act, has_res, x, w, w.t().contiguous(), b, res, y, cu, want)

    def peers(self) -> dict[str, Callable[[], Any]]:
        """The cuBLAS peers (their outputs are not checked): the GEMM with its bias, and with the epilogue."""

        def unfused() -> None:
            z = F.linear(self.x, self.w, self.b)
            if self.act:
                z = F.gelu(z)
            if self.has_res:
                z = z + self.res

        return {"cublas_gemm": lambda: F.linear(self.x, self.w, self.b), "cublas_unfused": unfused}


def time_impls(
    case: GemmCase, fns: dict[str, Callable[[], Any]], base: dict[str, Any], flops_key: str, flop_rows: int
) -> list[dict[str, Any]]:
    """A record per implementation: `base` fields, impl, max_abs_err (implementations writing case.y; a result
    off the reference by 0.05 or more is an error, not timed), gpu_us and `flops_key` (TFLOP/s over `flop_rows`
    rows), or error (compile errors, shared memory)."""
    records = []
    for impl, fn in fns.items():
        rec: dict[str, Any] = {**base, "impl": impl}
        try:
            case.y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if not impl.startswith("cublas"):
                err = (case.y.float() - case.want).abs().max().item()
                rec["max_abs_err"] = err
                if not err < 0.05:
                    rec["error"] = f"wrong result: max abs err {err}"
                    records.append(rec)
                    continue
            rec["gpu_us"] = graph_time_us(fn, inner=10, reps=7)[0]
            rec[flops_key] = 2 * flop_rows * case.N * case.K / rec["gpu_us"] / 1e6
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = repr(exc)[:300]
        records.append(rec)
    return records
