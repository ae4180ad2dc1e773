"""Fuzz cases of com.raggedvit::PatchEmbed on the CPU EP (calls with index % 10 == EMBED_AT of
`fuzz.linear.draw_any`).

A case is a pure function of (seed, index): random B (0 included), C (0 included), patch 1..16 (a few larger valid
ones: 17..40, and 32768 with C = 0), grids gh x gw from 0 (no patch rows) with H, W crops that are not multiples of
patch, P from 0, N (0 included), float / float16 images with specials (inf, nan, values past float16's range,
float16 subnormals), specials in Prefix / Pos; and broken ones (the patch attribute absent, a float, outside
[1, 32768]; Images ranks and types the CPU EP lacks; Weight, Prefix and Pos ranks, shapes and types).
`embed_expected_error` is the contract of raggedvit/custom_ops/patch_embed.h written independently of the C++ checks;
valid outputs must match the float64 reference (`patch_embed_reference`) within float16's half ulp and the rounding
of float32 sums (`check_embed_output`).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fuzz.cases import ELEM, TORCH, cpu_session, refusal, run_bound

__all__ = [
    "EMBED_AT",
    "EmbedCase",
    "check_embed_output",
    "draw_embed_case",
    "embed_expected_error",
    "embed_feeds",
    "run_embed_case",
]

EMBED_AT = 3  # call i is a PatchEmbed case when i % 10 == EMBED_AT (never a RaggedLinear, Select, Gelu or Norm index)
CPU_TYPES = ("float", "float16")
MAX_PATCH = 1 << 15  # the op's attribute limit
BAD_PATCHES = (0, -1, -16, -(2**63), MAX_PATCH + 1, 2**31, 2**62, 8.0, None)  # 8.0: a float attribute
MACS = 1 << 21  # bound on B * L * K * N of a valid case (the op, and the reference twice)
WANT = {"Weight": "float16", "Prefix": "float", "Pos": "float"}


@dataclass(frozen=True)
class EmbedCase:
    index: int
    image_elem: str
    image_shape: tuple[int, ...]
    patch: int | float | None  # the attribute as written (None: absent)
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # (input, element type, shape) of Weight, Prefix, Pos
    shaped: bool  # inputs declared with symbolic shapes (else no shape: bad ranks reach the op)
    specials: bool
    amplitude: float
    data_seed: int

    def describe(self) -> str:
        return "PatchEmbed " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def _grid(rng: random.Random, cap: int) -> int:
    return 0 if rng.random() < 0.06 else rng.randint(1, max(1, cap))


def draw_embed_case(seed: int, index: int) -> EmbedCase:
    """The PatchEmbed case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-embed:{seed}:{index}")
    image_elem = rng.choice(CPU_TYPES) if rng.random() < 0.95 else rng.choice(("bfloat16", "double", "int32"))
    r = rng.random()
    patch: int | float | None = rng.randint(1, 16)
    if r < 0.05:
        patch = rng.choice(BAD_PATCHES)
    elif r < 0.08:
        patch = rng.randint(17, 40)
    C = 0 if rng.random() < 0.03 else rng.randint(1, 4 if r >= 0.05 and patch <= 16 else 2)
    if r >= 0.05 and rng.random() < 0.01:
        patch, C = MAX_PATCH, 0  # K = 0, no patch rows (H, W < patch)
    p = patch if isinstance(patch, int) and 1 <= patch <= MAX_PATCH else 8  # the shapes of a bad attribute's case
    B = 0 if rng.random() < 0.06 else rng.randint(1, 4)
    N = 0 if rng.random() < 0.03 else rng.randint(1, 96)
    P = 0 if rng.random() < 0.3 else rng.randint(1, 3)
    K = C * p * p
    cap = min(max(8, 48 // p), int(math.sqrt(MACS / max(1, B * K * N))), (1 << 9) // p)
    gh, gw = _grid(rng, cap), _grid(rng, cap)

    def crop() -> int:
        return rng.randint(1, p - 1) if p > 1 and rng.random() < 0.6 else 0

    H, W = gh * p + crop(), gw * p + crop()
    if p == MAX_PATCH:
        H, W = rng.randint(0, 40), rng.randint(0, 40)
        gh = gw = 0
    L = gh * gw
    image_shape: tuple[int, ...] = (B, C, H, W)
    if rng.random() < 0.03:
        image_shape = rng.choice([(B, C, H), (B, C, H, W, 1), (C, H, W), ()])
    shapes = {"Weight": (K, N), "Prefix": (P, N), "Pos": (P + L, N)}
    wrong = {
        "Weight": [(K + 1, N), (max(K - 1, 0), N + 1), (C * (p + 1) ** 2, N), (K * N,), (1, K, N), (N + 1, K)],
        "Prefix": [(P, N + 1), (N,), (1, P, N), (P, max(N - 1, 0)) if N else (P, 3)],
        "Pos": [(P + L + 1, N), (L + 1, N) if P == 0 else (L, N), (P + L, N + 1), ((P + L) * N,), (1, P + L, N)],
    }
    inputs = []
    for name, shape in shapes.items():
        if rng.random() < 0.03:
            shape = rng.choice(wrong[name])
        elem = WANT[name]
        if rng.random() < 0.025:
            elem = rng.choice([e for e in ("float", "float16", "double") if e != elem])
        inputs.append((name, elem, shape))
    return EmbedCase(index, image_elem, image_shape, patch, tuple(inputs), rng.random() < 0.2, rng.random() < 0.2,
                     rng.choice((1.0, 1.0, 4.0, 100.0)), rng.getrandbits(62))  # fmt: skip


def embed_expected_error(c: EmbedCase) -> str | None:
    """Why the op must refuse `c`, as "embed <category>: <detail>" (None: it must run and match the reference)."""
    if not isinstance(c.patch, int) or not 1 <= c.patch <= MAX_PATCH:
        return f"embed patch: {c.patch!r}"
    if len(c.image_shape) != 4:
        return f"embed Images rank: {c.image_shape}"
    if c.image_elem not in CPU_TYPES:
        return f"embed Images type: {c.image_elem}"
    B, C, H, W = c.image_shape
    K, L = C * c.patch * c.patch, (H // c.patch) * (W // c.patch)
    given = {name: (elem, shape) for name, elem, shape in c.inputs}
    w_shape = given["Weight"][1]
    if len(w_shape) != 2 or w_shape[0] != K or given["Weight"][0] != WANT["Weight"]:
        return f"embed Weight: {given['Weight']} vs K = {K}"
    N = w_shape[1]
    p_shape = given["Prefix"][1]
    if len(p_shape) != 2 or p_shape[1] != N or given["Prefix"][0] != WANT["Prefix"]:
        return f"embed Prefix: {given['Prefix']} vs N = {N}"
    want = (p_shape[0] + L, N)
    if given["Pos"][1] != want or given["Pos"][0] != WANT["Pos"]:
        return f"embed Pos: {given['Pos']} vs float {want}"
    return None


def _sprinkle(t: torch.Tensor, vals: list[float], gen: torch.Generator, every: int) -> None:
    if t.numel():
        pick = torch.randint(0, t.numel(), (max(1, t.numel() // every),), generator=gen)
        v = torch.tensor(vals, dtype=torch.float64)
        t.view(-1)[pick] = v[torch.randint(0, len(v), pick.shape, generator=gen)]


def embed_feeds(c: EmbedCase) -> dict[str, torch.Tensor]:
    """The inputs of `c` (deterministic in c.data_seed), of its shapes and element types."""
    gen = torch.Generator().manual_seed(c.data_seed)
    dtype = TORCH[c.image_elem]
    if dtype.is_floating_point:
        x = torch.randn(c.image_shape, generator=gen, dtype=torch.float64) * c.amplitude
        if c.specials:  # 7e4 and 65520 round to inf in float16, 65519 to 65504, 1e-7 to a subnormal, 1e-8 to 0
            _sprinkle(x, [math.inf, -math.inf, math.nan, 7e4, -65520.0, 65519.0, 1e-7, -1e-8, -0.0], gen, 64)
        images = x.to(dtype)
    else:
        images = torch.randint(-8, 8, c.image_shape, generator=gen, dtype=dtype)
    feeds = {"Images": images}
    for name, elem, shape in c.inputs:
        k = shape[0] if name == "Weight" and len(shape) == 2 else 1
        t = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(max(k, 1))
        if c.specials and name != "Weight" and torch.rand(1, generator=gen).item() < 0.5:
            _sprinkle(t, [math.inf, -math.inf, math.nan, 1e5, -7e4, 6e4], gen, 16)
        feeds[name] = t.to(TORCH[elem])
    return feeds


def check_embed_output(out: np.ndarray, feeds: dict[str, torch.Tensor], patch: int) -> str | None:
    """None when `out` [B, P + L, N] float16 is the float64 reference within half a float16 ulp, ~(K + 4) 2^-24 of
    the sum of absolute terms (float32 sums), and float16's half subnormal; non-finite values exactly (nan where
    the reference is nan, the same inf), inf also where the reference rounds past float16's range."""
    from raggedvit.kernels.patch_embed import patch_embed_reference

    args = [feeds[n] for n in ("Images", "Weight", "Prefix", "Pos")]
    want = patch_embed_reference(*args, patch, compute_dtype=torch.float64).numpy()
    magnitude = patch_embed_reference(*[a.abs() for a in args], patch, compute_dtype=torch.float64).numpy()
    K = args[1].shape[0]
    got = out.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        sums = (1.001 * K + 4) * 2.0**-24 * np.nan_to_num(magnitude, nan=0.0, posinf=0.0)
        tol = 2.0**-11 * np.abs(want) + sums + 2.0**-24
        near = np.abs(got - want) <= tol
        past = np.isinf(got) & (np.sign(got) == np.sign(want)) & (np.abs(want) + tol >= 65520.0)
        finite = np.isfinite(want)
        same = np.where(np.isnan(want), np.isnan(got), got == want)
        ok = np.where(finite, near | past, same)
    if ok.all():
        return None
    bad = ~ok
    where = np.argwhere(bad)[:3].tolist()
    return (f"Out differs from the reference at {int(bad.sum())} of {got.size} elements (at {where}): "
            f"got {got[bad][:3].tolist()}, want {want[bad][:3].tolist()}")  # fmt: skip


def run_embed_case(c: EmbedCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    from tests.support.ort_models import embed_model

    expected = embed_expected_error(c)
    elems = {name: ELEM[elem] for name, elem, _ in c.inputs}
    key = repr(("embed", c.image_elem, c.patch, sorted(elems.items()), c.shaped))
    try:
        sess = cpu_session(sessions, key, lambda: embed_model(ELEM[c.image_elem], patch=c.patch, elems=elems,
                                                              shaped=c.shaped))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = embed_feeds(c)
    try:
        (out,) = run_bound(sess, feeds, ("Out",))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    B, _, H, W = c.image_shape
    want_shape = (B, feeds["Pos"].shape[0], feeds["Weight"].shape[1])
    if tuple(out.shape) != want_shape or out.dtype != np.float16:
        return "failed", f"Out is {out.dtype} {tuple(out.shape)}, not float16 {want_shape}"
    if not out.size:
        return "checked", None
    err = check_embed_output(out, feeds, int(c.patch))
    return ("failed", err) if err else ("checked", None)
