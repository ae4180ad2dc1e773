"""One shared closeness check for every test (and the fuzz drivers)."""

from __future__ import annotations

import math

import torch

__all__ = ["assert_close", "default_tolerance", "gelu_float64", "rel_error"]

_TOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def default_tolerance(dtype: torch.dtype) -> float:
    """Relative error budget of `dtype` arithmetic against a float64 reference."""
    return _TOL[dtype]


def gelu_float64(s: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU of s in float64, as s * erfc(-s / sqrt 2) / 2: no 1 + erf cancellation in the negative
    tail, so it stays a relative reference there (-inf gives nan, as the erf form does)."""
    s = s.double()
    return 0.5 * s * torch.special.erfc(-s / math.sqrt(2.0))


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / max(||expected||, tiny), computed in float64."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    denom = max(float(e.norm()), 1e-30)
    return float((a - e).norm()) / denom


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    rtol: float | None = None,
    atol: float = 0.0,
    name: str = "tensor",
) -> None:
    """Assert shape equality, no NaN/inf, norm-relative error <= rtol and max error <= atol + rtol*max|expected|.

    rtol defaults to the tolerance of actual.dtype.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    if actual.numel() == 0:
        return
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if not torch.isfinite(a).all():
        bad = (~torch.isfinite(a)).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: non-finite values at {bad}")
    tol = default_tolerance(actual.dtype) if rtol is None else rtol
    rel = rel_error(a, e)
    max_err = float((a - e).abs().max())
    bound = atol + 20 * tol * float(e.abs().max())
    if rel > tol or max_err > bound:
        idx = int((a - e).abs().argmax())
        raise AssertionError(
            f"{name}: rel error {rel:.3e} (limit {tol:.1e}), max abs error {max_err:.3e} "
            f"(limit {bound:.3e}) at flat index {idx}: got {a.flatten()[idx]:.6g}, expected {e.flatten()[idx]:.6g}"
        )
