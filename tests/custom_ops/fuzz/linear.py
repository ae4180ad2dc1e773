"""Fuzz cases of com.raggedvit::RaggedLinear on the CPU EP, and the dispatch over the ops of the CPU fuzz.

Every FIFTH call of a fuzz run (index % 5 == 4) is a RaggedLinear case (`draw_any`), index % 10 == 2 a RaggedSelect case
(`fuzz.select`), index % 10 == 7 a BiasGelu case (`fuzz.gelu`), index % 10 == 5 a GatherLayerNorm case (`fuzz.norm`),
index % 10 == 3 a PatchEmbed case (`fuzz.embed`), index % 40 == 8 an input-count case of any op (`fuzz.arity`), index %
20 == 6 a RaggedMerge case (`fuzz.merge`), the others RaggedAttention cases of `fuzz.cases`. A linear case is a pure
function of (seed, index) too: random T (0 included), N, K, dead rows through CuSeqlens values of any kind (above T,
negative, the dtype's extremes, B = 0: all valid, the op clamps cu[B]), optional Bias / Residual / CuSeqlens, activation
0 / 1; and broken ones (ranks, K mismatch, Bias and Residual shapes and types, CuSeqlens shapes and types, X types the
CPU EP lacks, bad activation values and types). `linear_expected_error` is the contract written independently of the C++
checks.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch
from onnx import TensorProto, helper

from fuzz import cases as fuzz_cases
from fuzz.arity import ARITY_AT, ARITY_EVERY, ArityCase, arity_expected_error, draw_arity_case, run_arity_case
from fuzz.cases import ELEM, TORCH, Case, cpu_session, quiet_run_options, refusal
from fuzz.embed import EMBED_AT, EmbedCase, draw_embed_case, embed_expected_error, run_embed_case
from fuzz.gelu import GELU_AT, GeluCase, draw_gelu_case, gelu_expected_error, run_gelu_case
from fuzz.merge import MERGE_AT, MERGE_EVERY, MergeFuzzCase, draw_merge_case, merge_expected_error, run_merge_case
from fuzz.norm import NORM_AT, NormCase, draw_norm_case, norm_expected_error, run_norm_case
from fuzz.select import (
    SELECT_AT,
    SelectFuzzCase,
    draw_select_case,
    run_select_case,
    select_expected_error,
)
from tests.support.ort_models import model_bytes

__all__ = ["LinearCase", "draw_any", "draw_linear_case", "expected_any", "linear_expected_error", "run_any"]

LINEAR_EVERY = 5  # call i is a RaggedLinear case when i % LINEAR_EVERY == LINEAR_EVERY - 1
CPU_TYPES = ("float", "float16")


@dataclass(frozen=True)
class LinearCase:
    """One RaggedLinear call: node (activation, declared types) and inputs (shapes, CuSeqlens values)."""

    index: int
    x_elem: str
    w_elem: str
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    bias: tuple[str, tuple[int, ...]] | None  # (element type, shape) or absent
    residual: tuple[str, tuple[int, ...]] | None
    cu_elem: str | None  # "float" matches no registered kernel
    cu: list  # nested list for a rank-2 CuSeqlens
    activation: int | float | None  # a float: wrong attribute type
    data_seed: int

    def describe(self) -> str:
        return "RaggedLinear " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def _draw_cu(rng: random.Random, T: int, cu_elem: str) -> list:
    info = np.iinfo(np.int32 if cu_elem == "int32" else np.int64)
    r = rng.random()
    if r < 0.05:
        return []  # no entry: refused
    if r < 0.08:
        return [[0, T]]  # rank 2: refused
    cuts = sorted(rng.randint(0, T) for _ in range(rng.randint(0, 5)))
    last = rng.choice([T, T, rng.randint(0, T), T + rng.randint(1, 50), -rng.randint(1, 50), int(info.max),
                       int(info.min)])  # fmt: skip
    return [0, *cuts, last]


def draw_linear_case(seed: int, index: int) -> LinearCase:
    """The linear case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-linear:{seed}:{index}")
    x_elem = rng.choice(CPU_TYPES) if rng.random() < 0.92 else rng.choice(("bfloat16", "double"))
    T = 0 if rng.random() < 0.06 else rng.randint(1, 64)
    N, K = rng.randint(1, 72), rng.randint(1, 72)
    x_shape: tuple[int, ...] = (T, K)
    w_shape: tuple[int, ...] = (N, K)
    r = rng.random()
    if r < 0.03:
        x_shape = (2, T, K)
    elif r < 0.06:
        w_shape = (N * K,)
    elif r < 0.10:
        w_shape = (N, K + rng.choice((-1, 1, 16)))
    w_elem = x_elem if rng.random() < 0.96 else rng.choice([e for e in CPU_TYPES if e != x_elem])

    def optional(shape: tuple[int, ...], wrong: list[tuple[int, ...]]) -> tuple[str, tuple[int, ...]] | None:
        if rng.random() < 0.5:
            return None
        elem = x_elem if rng.random() < 0.95 else rng.choice([e for e in ("float", "float16", "int32") if e != x_elem])
        return elem, (rng.choice(wrong) if rng.random() < 0.08 else shape)

    bias = optional((N,), [(N + 1,), (1, N), ()])
    residual = optional((T, N), [(T + 1, N), (T, N + 1), (T * N,)])
    cu_elem = None if rng.random() < 0.3 else (rng.choice(("int32", "int64")) if rng.random() < 0.97 else "float")
    cu = _draw_cu(rng, T, cu_elem or "int64") if cu_elem else []
    r = rng.random()
    activation = rng.choice((0, 1)) if r < 0.6 else (None if r < 0.95 else rng.choice((2, -1, 1.0)))
    return LinearCase(index, x_elem, w_elem, x_shape, w_shape, bias, residual, cu_elem, cu, activation,
                      rng.getrandbits(62))  # fmt: skip


def linear_expected_error(c: LinearCase) -> str | None:
    """Why the op must refuse `c`, as "linear <category>: <detail>" (None: it must run and match the reference)."""
    if c.activation is not None and (not isinstance(c.activation, int) or c.activation not in (0, 1)):
        return f"linear activation: {c.activation!r}"
    if c.cu_elem == "float":
        return "linear CuSeqlens type: float"
    if c.x_elem not in CPU_TYPES:
        return f"linear X type: {c.x_elem}"
    if len(c.x_shape) != 2:
        return f"linear X rank: {len(c.x_shape)}"
    T, K = c.x_shape
    if len(c.w_shape) != 2 or c.w_shape[1] != K:
        return f"linear W shape: {c.w_shape} vs K = {K}"
    if c.w_elem != c.x_elem:
        return f"linear W type: {c.w_elem} vs {c.x_elem}"
    N = c.w_shape[0]
    for name, opt, shape in (("Bias", c.bias, (N,)), ("Residual", c.residual, (T, N))):
        if opt is not None and (opt[0] != c.x_elem or opt[1] != shape):
            return f"linear {name}: {opt} vs {c.x_elem} {shape}"
    if c.cu_elem is not None and (not c.cu or isinstance(c.cu[0], list)):
        return f"linear CuSeqlens shape: {np.shape(c.cu)}"
    return None


def _model(c: LinearCase) -> bytes:
    present = {"Bias": c.bias, "Residual": c.residual}
    names = ["X", "W", "Bias" if c.bias else "", "Residual" if c.residual else "", "CuSeqlens" if c.cu_elem else ""]
    while not names[-1]:
        names.pop()
    attrs = {} if c.activation is None else {"activation": c.activation}
    node = helper.make_node("RaggedLinear", names, ["Y"], domain="com.raggedvit", **attrs)
    inputs = [helper.make_tensor_value_info("X", ELEM[c.x_elem], None),
              helper.make_tensor_value_info("W", ELEM[c.w_elem], None)]  # fmt: skip
    inputs += [helper.make_tensor_value_info(n, ELEM[v[0]], None) for n, v in present.items() if v is not None]
    if c.cu_elem:
        cu_type = TensorProto.FLOAT if c.cu_elem == "float" else ELEM[c.cu_elem]
        inputs.append(helper.make_tensor_value_info("CuSeqlens", cu_type, None))
    graph = helper.make_graph([node], "fuzz_linear", inputs, [helper.make_tensor_value_info("Y", ELEM[c.x_elem], None)])
    return model_bytes(graph)


def _tensors(c: LinearCase) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(c.data_seed)

    def rand(shape: tuple[int, ...], elem: str, scale: float = 1.0) -> torch.Tensor:
        if not TORCH[elem].is_floating_point:
            return torch.randint(-4, 4, shape, generator=gen, dtype=TORCH[elem])
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(TORCH[elem])

    K = c.x_shape[-1]
    feeds = {"X": rand(c.x_shape, c.x_elem), "W": rand(c.w_shape, c.w_elem, 1 / math.sqrt(max(K, 1)))}
    if c.bias:
        feeds["Bias"] = rand(c.bias[1], c.bias[0])
    if c.residual:
        feeds["Residual"] = rand(c.residual[1], c.residual[0])
    if c.cu_elem:
        feeds["CuSeqlens"] = torch.tensor(c.cu, dtype=torch.float32 if c.cu_elem == "float" else TORCH[c.cu_elem])
    return feeds


def _reference(c: LinearCase, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    T = c.x_shape[0]
    v = feeds["X"].double() @ feeds["W"].double().T
    if "Bias" in feeds:
        v = v + feeds["Bias"].double()
    if c.activation == 1:
        v = 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))
    if "Residual" in feeds:
        v = v + feeds["Residual"].double()
    live = T if not c.cu_elem else min(max(int(c.cu[-1]), 0), T)
    v[live:] = 0.0
    return v


def run_linear_case(c: LinearCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    from raggedvit.runtime import bind_tensor
    from tests.support.testing import assert_close

    expected = linear_expected_error(c)
    key = repr(("linear", c.x_elem, c.w_elem, c.bias and c.bias[0], c.residual and c.residual[0], c.cu_elem,
                c.activation))  # fmt: skip
    try:
        sess = cpu_session(sessions, key, lambda: _model(c))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = _tensors(c)
    y = None
    if expected is None:
        y = torch.full((c.x_shape[0], c.w_shape[0]), math.nan, dtype=TORCH[c.x_elem])
    binding = sess.io_binding()
    run_options = quiet_run_options()
    try:
        for name, value in feeds.items():
            bind_tensor(binding, name, value)
        if y is not None and y.numel():
            bind_tensor(binding, "Y", y, output=True)
        else:
            binding.bind_output("Y", "cpu")
        sess.run_with_iobinding(binding, run_options)
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    if y is None or not y.numel():
        shape = binding.get_outputs()[0].shape()
        want = [c.x_shape[0], c.w_shape[0]]
        return ("checked", None) if shape == want else ("failed", f"empty Y has shape {shape}, not {want}")
    try:
        assert_close(y, _reference(c, feeds).to(y.dtype), name="Y")
    except AssertionError as e:
        return "failed", str(e)
    return "checked", None


AnyCase = Case | LinearCase | SelectFuzzCase | GeluCase | NormCase | EmbedCase | ArityCase | MergeFuzzCase


def draw_any(seed: int, index: int) -> AnyCase:
    """Call `index` of fuzz run `seed`: a RaggedLinear case every LINEAR_EVERY calls, a RaggedSelect case when
    index % 10 == SELECT_AT, a BiasGelu case when index % 10 == GELU_AT, a GatherLayerNorm case when index % 10 ==
    NORM_AT, a PatchEmbed case when index % 10 == EMBED_AT, an input-count case when index % ARITY_EVERY ==
    ARITY_AT, a RaggedMerge case when index % MERGE_EVERY == MERGE_AT, else a RaggedAttention one."""
    if index % LINEAR_EVERY == LINEAR_EVERY - 1:
        return draw_linear_case(seed, index)
    if index % 10 == SELECT_AT:
        return draw_select_case(seed, index)
    if index % 10 == GELU_AT:
        return draw_gelu_case(seed, index)
    if index % 10 == NORM_AT:
        return draw_norm_case(seed, index)
    if index % 10 == EMBED_AT:
        return draw_embed_case(seed, index)
    if index % ARITY_EVERY == ARITY_AT:
        return draw_arity_case(seed, index)
    if index % MERGE_EVERY == MERGE_AT:
        return draw_merge_case(seed, index)
    return fuzz_cases.draw_case(seed, index)


def expected_any(c: AnyCase) -> str | None:
    if isinstance(c, SelectFuzzCase):
        return select_expected_error(c)
    if isinstance(c, GeluCase):
        return gelu_expected_error(c)
    if isinstance(c, NormCase):
        return norm_expected_error(c)
    if isinstance(c, EmbedCase):
        return embed_expected_error(c)
    if isinstance(c, ArityCase):
        return arity_expected_error(c)
    if isinstance(c, MergeFuzzCase):
        return merge_expected_error(c)
    return linear_expected_error(c) if isinstance(c, LinearCase) else fuzz_cases.expected_error(c)


def run_any(c: AnyCase, sessions: dict) -> tuple[str, str | None]:
    if isinstance(c, SelectFuzzCase):
        return run_select_case(c, sessions)
    if isinstance(c, GeluCase):
        return run_gelu_case(c, sessions)
    if isinstance(c, NormCase):
        return run_norm_case(c, sessions)
    if isinstance(c, EmbedCase):
        return run_embed_case(c, sessions)
    if isinstance(c, ArityCase):
        return run_arity_case(c, sessions)
    if isinstance(c, MergeFuzzCase):
        return run_merge_case(c, sessions)
    return run_linear_case(c, sessions) if isinstance(c, LinearCase) else fuzz_cases.run_case(c, sessions)
