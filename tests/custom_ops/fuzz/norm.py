"""Fuzz cases of com.raggedvit::GatherLayerNorm on the CPU EP (calls with index % 10 == NORM_AT of
`fuzz.linear.draw_any`).

A case is a pure function of (seed, index): random T, R (0 included), D, indices of any value (negative, out of
range, the int64 extremes: all valid, those outside [-T, T) give zero rows), values with specials (inf, nan,
huge), optional Skip / Bias, an epsilon, and in about a third of the cases a CuSeqlens (int32 / int64, B from 0,
CuSeqlens[B] anywhere: inside [0, R], above R, negative, the dtype's extremes: all valid, the op clamps it to
[0, R]); and broken ones (ranks, Index type, Gamma / Beta / Skip / Bias shapes and types, X types the CPU EP lacks,
a negative epsilon, a CuSeqlens with no entry, of rank 2 or of type float). `norm_expected_error` is the contract
written independently of the C++ checks; valid outputs must match the float64 reference (`gather_layer_norm_reference`)
within the rounding of the output dtype and float32 sums in the live rows, and be exactly zero in the dead rows past
clamp(CuSeqlens[B], 0, R) (the CPU EP's choice for rows the op leaves unspecified) (`_check`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fuzz.cases import ELEM, TORCH, cpu_session, refusal, run_bound

__all__ = ["NORM_AT", "NormCase", "draw_norm_case", "live_rows", "norm_expected_error", "run_norm_case"]

NORM_AT = 5  # call i is a GatherLayerNorm case when i % 10 == NORM_AT (never a RaggedLinear, Select or Gelu index)
CPU_TYPES = ("float", "float16")
_I64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class NormCase:
    index: int
    x_elem: str
    x_shape: tuple[int, ...]
    index_elem: str
    index_shape: tuple[int, ...]
    params: tuple[tuple[str, str, tuple[int, ...]], ...]  # (input, element type, shape) of Gamma, Beta[, Skip, Bias]
    epsilon: float
    specials: bool
    data_seed: int
    cu_elem: str | None = None  # "float" matches no registered kernel
    cu: tuple = ()  # CuSeqlens' values (nested for rank 2)

    def describe(self) -> str:
        return "GatherLayerNorm " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def draw_norm_case(seed: int, index: int) -> NormCase:
    """The GatherLayerNorm case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-norm:{seed}:{index}")
    x_elem = rng.choice(CPU_TYPES) if rng.random() < 0.94 else rng.choice(("bfloat16", "double"))
    T = 0 if rng.random() < 0.05 else rng.randint(1, 60)
    D = 0 if rng.random() < 0.03 else rng.randint(1, 130)
    x_shape: tuple[int, ...] = (T, D)
    if rng.random() < 0.03:
        x_shape = rng.choice([(T,), (1, T, D)])
    R = 0 if rng.random() < 0.05 else rng.randint(1, 80)
    index_shape: tuple[int, ...] = (R,) if rng.random() > 0.03 else rng.choice([(R, 1), ()])
    index_elem = "int64" if rng.random() > 0.03 else "int32"
    params = []
    for name, shape in (("Gamma", (D,)), ("Beta", (D,)), ("Skip", (T, D)), ("Bias", (D,))):
        if name in ("Skip", "Bias") and rng.random() < 0.35:
            continue
        if rng.random() < 0.03:
            shape = rng.choice([(D + 1,), (1, D), ()]) if len(shape) == 1 else (T + 1, D)
        elem = x_elem if rng.random() > 0.03 else rng.choice([e for e in CPU_TYPES if e != x_elem])
        params.append((name, elem, shape))
    eps = rng.choice([1e-5, 1e-6, 0.0, 1e-12, 0.1]) if rng.random() > 0.03 else -1e-3
    specials, data_seed = rng.random() < 0.2, rng.getrandbits(62)  # drawn before CuSeqlens: older fields unchanged
    cu_elem = None if rng.random() < 0.65 else (rng.choice(("int32", "int64")) if rng.random() < 0.97 else "float")
    cu = _draw_cu(rng, R, cu_elem) if cu_elem else ()
    return NormCase(index, x_elem, x_shape, index_elem, index_shape, tuple(params), eps, specials, data_seed,
                    cu_elem, cu)  # fmt: skip


def _draw_cu(rng: random.Random, R: int, cu_elem: str) -> tuple:
    """CuSeqlens values: usually 1-D [B+1] with any last entry (the others are never read); a few broken shapes."""
    info = np.iinfo(np.int32 if cu_elem == "int32" else np.int64)
    r = rng.random()
    if r < 0.04:
        return ()  # no entry: refused
    if r < 0.07:
        return ((0, R),)  # rank 2: refused
    cuts = sorted(rng.randint(0, max(R, 1)) for _ in range(rng.randint(0, 4)))
    last = rng.choice([R, rng.randint(0, R), rng.randint(0, R), R + rng.randint(1, 50), -rng.randint(1, 50),
                       int(info.max), int(info.min)])  # fmt: skip
    return (last,) if rng.random() < 0.1 else (0, *cuts, last)  # (last,): B = 0


def norm_expected_error(c: NormCase) -> str | None:
    """Why the op must refuse `c`, as "norm <category>: <detail>" (None: it must run and match the reference)."""
    if c.epsilon < 0:
        return f"norm epsilon: {c.epsilon}"
    if len(c.x_shape) != 2:
        return f"norm X rank: {c.x_shape}"
    if len(c.index_shape) != 1 or c.index_elem != "int64":
        return f"norm Index: {c.index_elem} {c.index_shape}"
    T, D = c.x_shape
    want = {"Gamma": (D,), "Beta": (D,), "Skip": (T, D), "Bias": (D,)}
    for name, elem, shape in c.params:
        if shape != want[name] or elem != c.x_elem:
            return f"norm {name}: {elem} {shape} vs {c.x_elem} {want[name]}"
    if c.x_elem not in CPU_TYPES:
        return f"norm X type: {c.x_elem}"
    if c.cu_elem == "float":
        return "norm CuSeqlens type: float"
    if c.cu_elem is not None and (not c.cu or isinstance(c.cu[0], tuple)):
        return f"norm CuSeqlens shape: {c.cu!r}"
    return None


def live_rows(c: NormCase) -> int:
    """The live output rows of a valid case: clamp(CuSeqlens[B], 0, R), R without CuSeqlens."""
    R = c.index_shape[0]
    return R if c.cu_elem is None else min(max(int(c.cu[-1]), 0), R)


def _tensors(c: NormCase) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(c.data_seed)
    x = torch.randn(c.x_shape, generator=gen, dtype=torch.float64) * 3 + 1
    if c.specials and x.numel():
        pick = torch.randint(0, x.numel(), (max(1, x.numel() // 16),), generator=gen)
        vals = torch.tensor([float("inf"), float("-inf"), float("nan"), 6e4, -6e4])
        x.view(-1)[pick] = vals[torch.randint(0, len(vals), pick.shape, generator=gen)].double()
    feeds = {"X": x.to(TORCH[c.x_elem])}
    T = c.x_shape[0] if c.x_shape else 0
    n = int(np.prod(c.index_shape)) if c.index_shape else 1
    idx = torch.randint(-T - 3, T + 3, (n,), generator=gen)
    if n and torch.rand(1, generator=gen).item() < 0.2:
        idx[torch.randint(0, n, (1,), generator=gen)] = _I64[int(torch.randint(0, 2, (1,), generator=gen))]
    feeds["Index"] = idx.reshape(c.index_shape).to(torch.int64 if c.index_elem == "int64" else torch.int32)
    for name, elem, shape in c.params:
        base = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if name == "Gamma" else None
        t = base if base is not None else torch.randn(shape, generator=gen, dtype=torch.float64)
        feeds[name] = t.to(TORCH[elem])
    if c.cu_elem is not None:
        feeds["CuSeqlens"] = torch.tensor(c.cu, dtype=torch.float32 if c.cu_elem == "float" else TORCH[c.cu_elem])
    return feeds


def _check(n: torch.Tensor, s: torch.Tensor, feeds: dict[str, torch.Tensor], eps: float, live: int) -> str | None:
    from raggedvit.kernels.gather_layer_norm import gather_layer_norm_reference

    for name, got in (("Normed", n), ("Sum", s)):  # the CPU EP writes zeros to the dead rows (the op: unspecified)
        if got[live:].ne(0).any():
            return f"{name} has non-zero dead rows (live {live} of {got.shape[0]})"
    rn, rs = gather_layer_norm_reference(feeds["X"], feeds["Index"], feeds["Gamma"], feeds["Beta"], feeds.get("Skip"),
                                         feeds.get("Bias"), eps, feeds.get("CuSeqlens"),
                                         compute_dtype=torch.float64)  # fmt: skip
    fi = torch.finfo(n.dtype)
    D = feeds["X"].shape[1]
    absolute = {k: feeds[k].abs() if k in feeds else None for k in ("X", "Skip", "Bias")}
    _, magnitude = gather_layer_norm_reference(
        absolute["X"],
        feeds["Index"],
        feeds["Gamma"],
        feeds["Beta"],
        absolute["Skip"],
        absolute["Bias"],
        eps,
        compute_dtype=torch.float64,
    )
    magnitude = magnitude.nan_to_num(0.0, 0.0, 0.0)  # the float32 sum's rounding scales with its operands
    for name, got, want, scale in (("Normed", n, rn, torch.ones_like(rn)), ("Sum", s, rs, magnitude)):
        g = got.double()
        tol = (0.5 * fi.eps + (D + 4) * 2.0**-24) * (want.abs().nan_to_num(0.0, 0.0, 0.0) + scale)
        tol = tol + (0.0 if eps > 1e-9 else 1e-3)
        finite = torch.isfinite(want)
        ok = torch.where(finite, (g - want).abs() <= tol, ~torch.isfinite(g) | (want.abs() > fi.max))
        if name == "Sum":  # the sum's rounding: overflow to inf past the dtype's range is exact too
            ok |= torch.isinf(g) & (want.abs() >= fi.max)
        if not bool(ok.all()):
            bad = ~ok
            return f"{name} differs from the reference at {int(bad.sum())} of {g.numel()} elements: got {g[bad][:3].tolist()}, want {want[bad][:3].tolist()}"  # noqa: E501
    return None


def run_norm_case(c: NormCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    from tests.support.ort_models import norm_model

    expected = norm_expected_error(c)
    present = {name for name, _, _ in c.params}
    elems = {name: ELEM[elem] for name, elem, _ in c.params} | {"Index": ELEM[c.index_elem]}
    cu = None if c.cu_elem is None else ELEM[c.cu_elem]
    key = repr(("norm", c.x_elem, sorted(elems.items()), c.epsilon, cu))
    try:
        sess = cpu_session(sessions, key, lambda: norm_model(ELEM[c.x_elem], skip="Skip" in present,
                                                             bias="Bias" in present, cu=cu, epsilon=c.epsilon,
                                                             elems=elems, shaped=False))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = _tensors(c)
    try:
        n, s = run_bound(sess, feeds, ("Normed", "Sum"))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    want_shape = (c.index_shape[0], c.x_shape[1])
    if tuple(n.shape) != want_shape or tuple(s.shape) != want_shape:
        return "failed", f"outputs have shapes {tuple(n.shape)}, {tuple(s.shape)}, not {want_shape}"
    if not n.size:
        return "checked", None
    got = [torch.from_numpy(np.ascontiguousarray(a)) for a in (n, s)]
    err = _check(*got, feeds, c.epsilon, live_rows(c))
    return ("failed", err) if err else ("checked", None)
