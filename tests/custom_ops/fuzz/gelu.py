"""Fuzz cases of com.raggedvit::BiasGelu on the CPU EP (calls with index % 10 == GELU_AT of `fuzz.linear.draw_any`).

A case is a pure function of (seed, index): random X rank (1-4) and shape (empty included), values with specials
(inf, -inf, nan, huge, subnormal), optional Bias; and broken ones (scalar X, Bias shape and type, X types the CPU
EP lacks). `gelu_expected_error` is the contract written independently of the C++ checks; valid outputs must be
within half an ulp (+ 1e-5 + (x+b)^2 2^-24 relative, + 1e-4 of the smallest normal absolute) of a float64
erfc-form GELU (`_check`).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fuzz.cases import ELEM, TORCH, cpu_session, refusal, run_bound
from tests.support.testing import gelu_float64

__all__ = ["GELU_AT", "GeluCase", "draw_gelu_case", "gelu_expected_error", "run_gelu_case"]

GELU_AT = 7  # call i is a BiasGelu case when i % 10 == GELU_AT (never a RaggedLinear or RaggedSelect index)
CPU_TYPES = ("float", "float16")


@dataclass(frozen=True)
class GeluCase:
    index: int
    x_elem: str
    x_shape: tuple[int, ...]
    bias: tuple[str, tuple[int, ...]] | None  # (element type, shape) or absent
    specials: bool  # sprinkle inf / -inf / nan / huge / subnormal values into X
    data_seed: int

    def describe(self) -> str:
        return "BiasGelu " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def draw_gelu_case(seed: int, index: int) -> GeluCase:
    """The BiasGelu case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-gelu:{seed}:{index}")
    x_elem = rng.choice(CPU_TYPES) if rng.random() < 0.93 else rng.choice(("bfloat16", "double"))
    rank = 0 if rng.random() < 0.03 else rng.randint(1, 4)
    shape = tuple(0 if rng.random() < 0.04 else rng.randint(1, 9 if rank > 2 else 70) for _ in range(rank))
    bias = None
    if rng.random() < 0.7:
        n = shape[-1] if shape else 1
        b_shape: tuple[int, ...] = (n,)
        if rng.random() < 0.06:
            b_shape = rng.choice([(n + 1,), (1, n), ()])
        b_elem = x_elem if rng.random() < 0.95 else rng.choice([e for e in ("float", "float16") if e != x_elem])
        bias = (b_elem, b_shape)
    return GeluCase(index, x_elem, shape, bias, rng.random() < 0.3, rng.getrandbits(62))


def gelu_expected_error(c: GeluCase) -> str | None:
    """Why the op must refuse `c`, as "gelu <category>: <detail>" (None: it must run and match the reference)."""
    if c.x_elem not in CPU_TYPES:
        return f"gelu X type: {c.x_elem}"
    if not c.x_shape:
        return "gelu X rank: 0"
    if c.bias is not None and (c.bias[1] != (c.x_shape[-1],) or c.bias[0] != c.x_elem):
        return f"gelu Bias: {c.bias} vs {c.x_elem} ({c.x_shape[-1]},)"
    return None


def _tensors(c: GeluCase) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(c.data_seed)
    x = torch.randn(c.x_shape, generator=gen, dtype=torch.float64) * 4
    if c.specials and x.numel():
        pick = torch.randint(0, x.numel(), (max(1, x.numel() // 8),), generator=gen)
        vals = torch.tensor([math.inf, -math.inf, math.nan, 6e4, -6e4, 1e-7, -1e-7, -12.0])
        x.view(-1)[pick] = vals[torch.randint(0, len(vals), pick.shape, generator=gen)].double()
    feeds = {"X": x.to(TORCH[c.x_elem])}
    if c.bias:
        feeds["Bias"] = torch.randn(c.bias[1], generator=gen, dtype=torch.float64).to(TORCH[c.bias[0]])
    return feeds


def _check(y: torch.Tensor, feeds: dict[str, torch.Tensor]) -> str | None:
    s = feeds["X"].double() + (feeds["Bias"].double() if "Bias" in feeds else 0.0)
    ref = gelu_float64(s)  # -inf * 0 = nan, as the op gives
    fi = torch.finfo(y.dtype)
    # relative: half an ulp, 1e-5 of float32 math, and s^2 2^-24 (rounding z = -s/sqrt 2 to float32 moves erfc(z) by
    # 2 z dz); absolute: 1e-4 of the smallest normal (float32 erfc goes subnormal past s ~ -13, |GELU| < 1e-37)
    bound = (0.5 * fi.eps + 1e-5 + s.nan_to_num(0.0, 0.0, 0.0) ** 2 * 2.0**-24) * ref.abs()
    bound = bound + fi.tiny * (0.5 * fi.eps + 1e-4)
    yd = y.double()
    same_nan = torch.isnan(yd) == torch.isnan(ref)
    close = torch.isnan(ref) | (yd == ref) | ((yd - ref).abs() <= bound)
    if ref.dtype != yd.dtype or not bool((same_nan & close).all()):
        bad = ~(same_nan & close)
        return f"Y differs from the reference at {int(bad.sum())} of {y.numel()} elements: e.g. x+b={s[bad][:3].tolist()}, y={yd[bad][:3].tolist()}, ref={ref[bad][:3].tolist()}"  # noqa: E501
    return None


def run_gelu_case(c: GeluCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    from tests.support.ort_models import gelu_model

    expected = gelu_expected_error(c)
    key = repr(("gelu", c.x_elem, c.bias and c.bias[0]))
    bias_elem = ELEM[c.bias[0]] if c.bias else None
    try:
        sess = cpu_session(sessions, key, lambda: gelu_model(ELEM[c.x_elem], bias=bool(c.bias), bias_elem=bias_elem,
                                                             rank=None))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = _tensors(c)
    try:
        (y,) = run_bound(sess, feeds, ("Y",))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    if tuple(y.shape) != c.x_shape:
        return "failed", f"Y has shape {tuple(y.shape)}, not {c.x_shape}"
    err = _check(torch.from_numpy(np.ascontiguousarray(y)), feeds)
    return ("failed", err) if err else ("checked", None)
