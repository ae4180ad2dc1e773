"""Fuzz cases of com.raggedvit::RaggedMerge on the CPU EP (calls with index % MERGE_EVERY == MERGE_AT of
`fuzz.linear.draw_any`).

A case is a pure function of (seed, index): random B (1-4), rows per image n (0 included), prefix count, r (0,
small, past half the patch rows), heads, head dim, width C, class token or not, optional qkv_bias, size, skip and
skip_bias, x float / float16 / bfloat16; and broken ones (x rank and type, qkv rows and width, qkv_bias and size
shapes, size and cu types, cu shape and values, T not B equal images, num_prefix past n, skip and skip_bias shapes,
skip_bias without skip, the attributes). `merge_expected_error` is the contract written independently of the C++
checks.

Valid outputs are compared with `merge_tokens_reference`: cu, src and sizes exact, key_bias and score within 1e-6,
x within float32 rounding (float16 / bfloat16: one step of the type). The keys are +-1 in every entry, the same in
every head, with a head dim of 1, 4, 16 or 64 and no k bias: the normalised entries are +-1/sqrt(Dh), exact, so
every cosine is exact in any summation order and the decisions (ties included, which such keys make common) are the
op's tie rules alone. x, sizes, skip and the biases are random (x without infinities: the reference's one-hot
product spreads an inf into other rows as NaN, the op sums the merged rows only).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from fuzz.cases import ELEM, TORCH, cpu_session, quiet_run_options, refusal, run_bound

__all__ = ["MERGE_AT", "MERGE_EVERY", "MergeFuzzCase", "draw_merge_case", "merge_expected_error", "run_merge_case"]

# call i is a RaggedMerge case when i % 20 == 6: half of the index % 10 == 6 calls, a RaggedAttention slot (never a
# RaggedLinear, Select, Gelu, Norm, Embed or input-count index)
MERGE_EVERY, MERGE_AT = 20, 6
CPU_TYPES = ("float", "float16", "bfloat16")
HEAD_DIMS = (1, 4, 16, 64)  # powers of 4: +-1 keys normalise exactly
FAULTS = (
    "x rank", "x type", "qkv rows", "qkv width", "qkv_bias shape", "size shape", "size type", "cu shape",
    "cu values", "cu type", "images", "num_prefix", "skip shape", "skip_bias shape", "skip_bias alone", "attributes",
)  # fmt: skip
_OUTPUTS = ("x_out", "size_out", "cu_out", "src", "key_bias", "score")


@dataclass(frozen=True)
class MergeFuzzCase:
    index: int
    x_elem: str
    B: int
    n: int
    C: int
    H: int
    Dh: int
    num_prefix: int
    r: int
    class_token: int
    qkv_bias: bool
    size: bool
    skip: bool
    skip_bias: bool
    fault: str  # "" (valid) or one of FAULTS
    data_seed: int

    def describe(self) -> str:
        return "RaggedMerge " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def draw_merge_case(seed: int, index: int) -> MergeFuzzCase:
    """The RaggedMerge case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-merge:{seed}:{index}")
    fault = rng.choice(FAULTS) if rng.random() < 0.35 else ""
    B = rng.randint(2 if fault == "images" else 1, 4)  # one image: any T is one image of T rows
    n = 0 if rng.random() < 0.04 else rng.randint(1, 45)
    p = rng.randint(0, min(n, 5))
    r = rng.choice((0, 1, rng.randint(1, 8), rng.randint(1, 40)))
    skip = rng.random() < 0.5 or fault == "skip shape"
    return MergeFuzzCase(
        index=index,
        x_elem=rng.choice(CPU_TYPES),
        B=B,
        n=n,
        C=rng.randint(1, 24),
        H=rng.randint(1, 3),
        Dh=rng.choice(HEAD_DIMS),
        num_prefix=p,
        r=r,
        class_token=rng.randint(0, 1),
        qkv_bias=rng.random() < 0.6,
        size=rng.random() < 0.6,
        skip=skip,
        skip_bias=skip and rng.random() < 0.6,
        fault=fault,
        data_seed=rng.getrandbits(62),
    )


def merge_expected_error(c: MergeFuzzCase) -> str | None:
    """Why the op must refuse `c`, as "merge <category>: <detail>" (None: it must run and match the reference)."""
    f = c.fault
    if not f:
        return None
    if f == "attributes":
        return "merge attributes: num_heads 0, r -1 or class_token 2"
    if f == "images":
        return f"merge x images: T = {c.B * c.n + 1} rows are not {c.B} images of equal length"
    if f == "num_prefix":
        return f"merge num_prefix values: {c.n + 1} > n = {c.n}"
    if f == "skip_bias alone":
        return "merge skip_bias alone: given without skip"
    if f.startswith("skip_bias") and not c.skip:
        return "merge skip_bias alone: given without skip"
    name, what = f.split(" ", 1)
    return f"merge {name} {what}: {c.describe()}"


def _fault_dims(c: MergeFuzzCase) -> dict:
    """The shapes and element types of the node's inputs with the case's fault applied."""
    T, W = c.B * c.n, 3 * c.H * c.Dh
    f = c.fault
    dims = {
        "x": (T + (1 if f == "images" else 0), c.C),
        "qkv": (T + (1 if f in ("images", "qkv rows") else 0), W + (1 if f == "qkv width" else 0)),
        "qkv_bias": (W + 1,) if f == "qkv_bias shape" else (W,),
        "size": (T + 1,) if f == "size shape" else (T + (1 if f == "images" else 0),),
        "cu": (1,) if f == "cu shape" else (c.B + 1,),
        "skip": (T + (1 if f == "images" else 0), c.C + (1 if f == "skip shape" else 0)),
        "skip_bias": (c.C + 1,) if f == "skip_bias shape" else (c.C,),
    }
    if f == "x rank":
        dims["x"] = (dims["x"][0],)
    elems = {k: c.x_elem for k in ("x", "qkv", "qkv_bias", "skip", "skip_bias")}
    if f == "x type":
        elems.update(dict.fromkeys(elems, "double"))
    elems |= {"size": "int64" if f == "size type" else "float", "cu": "int32" if f == "cu type" else "int64"}
    return {"dims": dims, "elems": elems}


def _present(c: MergeFuzzCase) -> dict[str, bool]:
    skip_bias = c.skip_bias or c.fault.startswith("skip_bias")
    return {"qkv_bias": c.qkv_bias or c.fault == "qkv_bias shape", "size": c.size or c.fault in ("size shape",
            "size type"), "skip": c.skip and c.fault != "skip_bias alone", "skip_bias": skip_bias}  # fmt: skip


def _tensors(c: MergeFuzzCase) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(c.data_seed)
    layout = _fault_dims(c)
    dims, elems = layout["dims"], layout["elems"]
    present = _present(c)
    (T, W), hd = dims["qkv"], c.H * c.Dh
    feeds: dict[str, torch.Tensor] = {"x": torch.randn(dims["x"], generator=gen).to(TORCH[elems["x"]])}
    qkv = torch.randn(T, W, generator=gen)
    keys = torch.randint(0, 2, (T, c.Dh), generator=gen).float() * 2 - 1  # +-1, the same in every head
    if W >= 2 * hd:
        qkv[:, hd : 2 * hd] = keys.repeat(1, c.H)
    feeds["qkv"] = qkv.to(TORCH[elems["qkv"]])
    if present["qkv_bias"]:
        bias = torch.randn(dims["qkv_bias"], generator=gen)
        bias[hd : 2 * hd] = 0.0  # no k bias: the keys stay exact
        feeds["qkv_bias"] = bias.to(TORCH[elems["qkv_bias"]])
    if present["size"]:
        feeds["size"] = (torch.rand(dims["size"], generator=gen) * 4 + 0.5).round().to(TORCH[elems["size"]])
    n = c.n + 1 if c.fault == "images" else c.n
    cu = torch.arange(c.B + 1, dtype=torch.int64) * n
    if c.fault == "cu values":
        cu[int(torch.randint(0, c.B + 1, (1,), generator=gen))] += 1
    if c.fault == "cu shape":
        cu = cu[:1]
    feeds["cu"] = cu.to(TORCH[elems["cu"]])
    if present["skip"]:
        feeds["skip"] = torch.randn(dims["skip"], generator=gen).to(TORCH[elems["skip"]])
    if present["skip_bias"]:
        feeds["skip_bias"] = torch.randn(dims["skip_bias"], generator=gen).to(TORCH[elems["skip_bias"]])
    return feeds


def _attrs(c: MergeFuzzCase) -> dict[str, int]:
    attrs = {"num_heads": c.H, "num_prefix": c.num_prefix, "r": c.r, "class_token": c.class_token}
    if c.fault == "num_prefix":
        attrs["num_prefix"] = c.n + 1
    if c.fault == "attributes":
        which = c.data_seed % 3
        attrs |= [{"num_heads": 0}, {"r": -1}, {"class_token": 2}][which]
    return attrs


def _check(outs: list[torch.Tensor], c: MergeFuzzCase, feeds: dict[str, torch.Tensor]) -> str | None:
    from raggedvit.pruning.merge import merge_tokens_reference

    ref = merge_tokens_reference(
        feeds["x"], feeds["qkv"], feeds.get("qkv_bias"), feeds.get("size"), feeds["cu"], c.H, c.num_prefix, c.r,
        bool(c.class_token), skip=feeds.get("skip"), skip_bias=feeds.get("skip_bias"),
    )  # fmt: skip
    for name, got, want in zip(_OUTPUTS, outs, ref):
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            return f"{name} is {got.dtype} {tuple(got.shape)}, the reference {want.dtype} {tuple(want.shape)}"
    for name in ("size_out", "cu_out", "src"):
        i = _OUTPUTS.index(name)
        if not torch.equal(outs[i], ref[i]):
            return f"{name} differs from the reference: {outs[i][:8].tolist()} vs {ref[i][:8].tolist()}"
    for name in ("key_bias", "score"):
        i = _OUTPUTS.index(name)
        if not torch.allclose(outs[i], ref[i], rtol=1e-6, atol=1e-6, equal_nan=True):
            return f"{name} differs from the reference by {(outs[i] - ref[i]).abs().max().item()}"
    x, want = outs[0].float(), ref[0].float()
    if ref[0].dtype == torch.float32:
        bound = 1e-5 * want.abs() + 1e-5
    else:  # rounded once from float32 sums in another order: one step of the type
        bound = torch.finfo(ref[0].dtype).eps * want.abs().clamp_min(torch.finfo(ref[0].dtype).tiny)
    bad = ~((x - want).abs() <= bound)
    if bool(bad.any()):
        return f"x_out differs from the reference at {int(bad.sum())} of {x.numel()} elements"
    return None


def _expected_outputs(c: MergeFuzzCase) -> dict[str, torch.Tensor]:
    """Output tensors of a valid case's shapes (bfloat16 x_out: numpy has no bfloat16, so it is bound)."""
    from raggedvit.pruning.merge import merge_widths, merged_count

    m = c.n - merged_count(c.n, c.num_prefix, c.r)
    rows, scores, i64 = c.B * m, c.B * merge_widths(c.n, c.num_prefix)[0], torch.int64
    shapes = ((rows, c.C), (rows,), (c.B + 1,), (rows,), (rows,), (scores,))
    dtypes = (TORCH[c.x_elem], torch.float32, i64, i64, torch.float32, torch.float32)
    return {k: torch.empty(s, dtype=d) for k, s, d in zip(_OUTPUTS, shapes, dtypes)}


def run_merge_case(c: MergeFuzzCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    from raggedvit.runtime import bind_tensor
    from tests.support.ort_models import merge_model

    expected = merge_expected_error(c)
    layout, present, attrs = _fault_dims(c), _present(c), _attrs(c)
    elems = {k: ELEM[v] for k, v in layout["elems"].items()}
    key = repr(("merge", sorted(elems.items()), sorted(present.items()), sorted(attrs.items())))
    try:
        sess = cpu_session(sessions, key, lambda: merge_model(elems["x"], attrs, **present, elems=elems,
                                                              any_rank=True))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = _tensors(c)
    try:
        if expected is None and c.x_elem == "bfloat16":
            outs = _expected_outputs(c)
            binding = sess.io_binding()
            for name, value in feeds.items():
                bind_tensor(binding, name, value)
            for name, value in outs.items():
                bind_tensor(binding, name, value, output=True)
            sess.run_with_iobinding(binding, quiet_run_options())
            got = [outs[k] if outs[k].numel() else torch.empty(outs[k].shape, dtype=outs[k].dtype) for k in _OUTPUTS]
        else:
            got = [torch.from_numpy(np.ascontiguousarray(a)) for a in run_bound(sess, feeds, _OUTPUTS)]
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    err = _check(got, c, feeds)
    return ("failed", err) if err else ("checked", None)

