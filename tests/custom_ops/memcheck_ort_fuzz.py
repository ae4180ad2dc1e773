"""Torch-free fuzz of the RaggedAttention, RaggedLinear, RaggedSelect, BiasGelu, GatherLayerNorm and PatchEmbed
CUDA-EP kernels, run under compute-sanitizer (from the checkout's root; test_sanitized_fuzz_gpu.py runs it):

    compute-sanitizer --tool memcheck --kernel-name kns=_ragged --kernel-name kns=_select_ \
        --kernel-name kns=_bias_gelu --kernel-name kns=_gather_layer_norm --kernel-name kns=_patch_embed \
        python3 -m tests.custom_ops.memcheck_ort_fuzz

Only onnxruntime(-gpu), numpy and the op library are loaded (no torch: its CUDA modules make the sanitizer's
start-up take minutes). A few sessions (dtype x cu dtype x heads x head dim) are reused for all calls; each call
draws T (a tenth of the calls, --large-t-share, from LARGE_ATTENTION_T: 2,048-6,000 rows, the large launch config's
fwd and cls cubins; the others up to --max-t) and cu_seqlens afresh, valid or invalid (decreasing, above T,
negative, last != T), and every tenth call also passes a qkv bias, of the right or a wrong shape or type; every
fifth call (and its neighbour's) passes the relative position bias (pos_table, token_pos with out-of-range values:
class rows), sometimes a pos_table or token_pos of the wrong shape. Invalid device data must not fault (the kernel
clamps; token_pos values never index outside pos_table); the outputs of valid calls are checked for finiteness.
Before them, sessions with crafted attributes (num_heads 0x5555555555555555, 2**62, INT64_MAX, 0, -1, a width that
is not a multiple of 3*num_heads) must be refused with an error, never a crash; they count as calls.
Then --linear-calls RaggedLinear calls (fp16 / bf16, cu int32 / int64, with and without Bias, Residual, CuSeqlens
and GELU): random T (0 included; a quarter of the calls from 1,024 rows up, the persistent TMA kernel's launches
on sm_90), N and K multiples of 16, CuSeqlens[B] anywhere (above T, negative, the dtype's
extremes: the kernel clamps it), so that row tiles past the live count are exercised; valid calls must give finite
live rows (dead rows are unspecified); some calls have K or N not a multiple of 16, a Residual of the wrong shape
or a W of the wrong width, which must come back as errors, never faults.
Then --gelu-calls BiasGelu calls (fp16 / bf16, with and without Bias, M from 0 to past the large-config threshold,
N multiples of 16): valid calls must match a numpy GELU to the dtype's rounding; N not a multiple of 16 or a Bias
of the wrong length must come back as errors, never faults.
Then --norm-calls GatherLayerNorm calls (fp16 / bf16, with and without Skip and Bias, without CuSeqlens or with an
int32 / int64 one, T and R from 0, D multiples of 16 up to 4096: every BLOCK_D variant), indices anywhere
(negative, past T, the int64 extremes: rows outside [-T, T) must come back zero, never fault), CuSeqlens[B]
anywhere (inside [0, R], above R, negative, the dtype's extremes: the kernel clamps it), so that programs past the
live count are exercised: valid calls must match a numpy oracle to the dtype's rounding in the live rows (dead rows
are never written); D not a multiple of 16, D above 4096, a Gamma of the wrong length or a CuSeqlens of rank 2 or
with no entry must come back as errors, never faults.
Then --embed-calls PatchEmbed calls (float / float16 images, one session per image type and patch in 4, 8, 14, 16):
random B (0 included, up to 40: every row-tile config), C 1..4, H and W 16..240 (multiples of 16: the aligned cubins
at patch 16; crops that are not multiples of patch; a few below patch: prefix rows only), P 0..2, N multiples of 16
up to 1024; valid calls must be finite and match a numpy oracle to float16's rounding on sampled rows (prefix rows,
the first and last patch rows, random ones); N not a multiple of 16, a Weight of the wrong K, a Prefix of the wrong
width, a Pos of the wrong row count or 3-D Images must come back as errors, never faults. Before them, sessions with
a bad patch attribute (absent, 0, -1, 32769) or double images must be refused; they count as calls.
Every fifth call of the --calls ones is a RaggedSelect call (tests/support/memcheck_select.py): random B,
rows per image, dead rows, a few attribute sets (width, bound <= width, num_prefix, both policies); its outputs must
equal a numpy oracle of the op (cu clamped as the kernels clamp it), on the CUDA EP and on the CPU EP for the cu
values the CPU EP accepts (it must refuse the others); bad attributes, element types and shapes must be refused.
Without a CUDA EP (onnxruntime without CUDA) only the RaggedSelect calls run, on the CPU EP.
Progress is printed every 100 calls; exit 1 on any unexpected error.

compute-sanitizer's --kernel-name kns=SUBSTRING instruments only kernels whose name contains SUBSTRING, and each
further --kernel-name adds a filter (a kernel matching any is checked): the command above passes kns=_ragged
(_ragged_attn_fwd, _ragged_cls_attn, _ragged_linear), kns=_select_ (_select_count, _select_scatter),
kns=_bias_gelu, kns=_gather_layer_norm and kns=_patch_embed.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from onnx import TensorProto, helper

from raggedvit.runtime import create_session, session_options
from tests.support.memcheck_select import SelectCalls

CASES = [  # (numpy dtype, onnx dtype, cu dtype, heads, head dim)
    (np.float16, TensorProto.FLOAT16, np.int32, 12, 64),
    (np.float16, TensorProto.FLOAT16, np.int64, 3, 128),
    (np.float32, TensorProto.FLOAT, np.int32, 2, 80),
    (np.float32, TensorProto.FLOAT, np.int64, 1, 32),
]


CRAFTED_HEADS = [0x5555555555555555, 2**62, 2**63 - 1, 0, -1, 5]  # 5: the width 3*2*64 is no multiple of 15


POS = ((14, 14), 1)  # grid and num_prefix of the relative position sessions
POS_ODD = (-1, 197, 2**31 - 1, -(2**31), 10**6)  # token_pos values outside the patches: class rows


def model(
    elem: int, cu_elem: int, heads: int, dim: int, *, bias: bool = False, width: int | None = None, pos: bool = False
) -> bytes:
    inputs = ["qkv", "cu"] + (["bias"] if bias else [])
    attrs = {"num_heads": heads}
    if pos:
        inputs = [*inputs, *[""] * (3 - len(inputs)), "pos_table", "token_pos"]
        attrs.update(grid_h=POS[0][0], grid_w=POS[0][1], num_prefix=POS[1])
    node = helper.make_node("RaggedAttention", inputs, ["out", "cls"], domain="com.raggedvit", **attrs)
    width = 3 * heads * dim if width is None else width
    graph = helper.make_graph(
        [node], "fuzz",
        [helper.make_tensor_value_info("qkv", elem, ["T", width]),
         helper.make_tensor_value_info("cu", cu_elem, ["B1"])]
        + ([helper.make_tensor_value_info("bias", elem, ["W"])] if bias else [])
        + ([helper.make_tensor_value_info("pos_table", TensorProto.FLOAT, ["H", "R"]),
            helper.make_tensor_value_info("token_pos", cu_elem, ["T2"])] if pos else []),
        [helper.make_tensor_value_info("out", elem, ["T", "HD"]),
         helper.make_tensor_value_info("cls", TensorProto.FLOAT, ["T"])],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)])
    m.ir_version = 10
    return m.SerializeToString()


LINEAR_CASES = ((TensorProto.FLOAT16, TensorProto.INT32), (TensorProto.BFLOAT16, TensorProto.INT64))
LINEAR_BAD = ("k_not_16", "n_not_16", "residual_shape", "w_width")


def linear_model(elem: int, cu_elem: int, *, full: bool) -> bytes:
    """RaggedLinear(X, W[, Bias, Residual, CuSeqlens]) -> Y; full: every optional input and GELU."""
    names = ["X", "W", "Bias", "Residual", "CuSeqlens"] if full else ["X", "W"]
    attrs = {"activation": 1} if full else {}
    node = helper.make_node("RaggedLinear", names, ["Y"], domain="com.raggedvit", **attrs)
    types = {"X": elem, "W": elem, "Bias": elem, "Residual": elem, "CuSeqlens": cu_elem}
    graph = helper.make_graph(
        [node], "fuzz_linear", [helper.make_tensor_value_info(n, types[n], None) for n in names],
        [helper.make_tensor_value_info("Y", elem, None)],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def ort_value(a: np.ndarray, elem: int):
    """A host OrtValue of `elem` (bfloat16 from float32 by truncation: numpy has no bfloat16)."""
    import onnxruntime as ort

    if elem == TensorProto.BFLOAT16:
        a = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, elem)
    return ort.OrtValue.ortvalue_from_numpy(
        np.ascontiguousarray(a, np.float16 if elem == TensorProto.FLOAT16 else a.dtype)
    )


def host_float32(value, elem: int) -> np.ndarray:
    """A host OrtValue -> float32 numpy. bfloat16 through its bits: OrtValue.numpy() has no numpy type for it
    (ONNX Runtime 1.31), so the uint16 words are read from data_ptr() and widened (bf16 is float32's top half)."""
    if elem != TensorProto.BFLOAT16:
        return value.numpy().astype(np.float32)
    import ctypes

    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, np.float32)
    words = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr())).copy()
    return (words.astype(np.uint32) << 16).view(np.float32).reshape(shape)


# RaggedAttention's large launch config starts at SMALL_T_LIMIT rows (raggedvit/kernels/_config.py, which imports
# torch; tests/custom_ops/test_memcheck_fuzz_ranges.py ties the two): a share of the attention calls draws T here
LARGE_ATTENTION_T = (2048, 6000)


def linear_calls(rng: np.random.Generator, calls: int, max_t: int) -> tuple[dict[str, int], int]:
    """RaggedLinear calls on the CUDA EP: (counts by kind, unexpected errors)."""
    sessions = [(create_session(linear_model(e, c, full=f), "cuda", disable_cpu_fallback=True), e, c, f)
                for e, c in LINEAR_CASES for f in (True, False)]  # fmt: skip
    counts: dict[str, int] = {}
    errors = 0
    for call in range(calls):
        sess, elem, cu_elem, full = sessions[call % len(sessions)]
        # a quarter of the calls from 1,024 rows (LARGE_T): the persistent TMA kernel on sm_90, up to ~140 tiles
        T = int(rng.integers(0, max_t + 1)) if rng.random() < 0.75 else int(rng.integers(1024, 6001))
        N, K = 16 * int(rng.integers(1, 17)), 16 * int(rng.integers(1, 17))
        kind = "valid" if rng.random() < 0.8 else str(rng.choice(LINEAR_BAD))
        if kind == "residual_shape" and not full:
            kind = "valid"  # no Residual input in this ORT session
        x_k, w_k, n, res_t = K, K, N, T
        if kind == "k_not_16":
            x_k = w_k = K + int(rng.integers(1, 16))
        elif kind == "n_not_16":
            n = N + int(rng.integers(1, 16))
        elif kind == "residual_shape":
            res_t = T + 1
        elif kind == "w_width":
            w_k = K + 16
        cu_np = np.int32 if cu_elem == TensorProto.INT32 else np.int64
        info = np.iinfo(cu_np)
        last = rng.choice([T, T, int(rng.integers(0, T + 1)), T + 100, -5, int(info.max), int(info.min)])
        feeds = {"X": rng.standard_normal((T, x_k)), "W": rng.standard_normal((n, w_k)) / 8}
        if full:
            feeds.update(Bias=rng.standard_normal(n), Residual=rng.standard_normal((res_t, n)))
        values = {k: ort_value(v.astype(np.float32), elem) for k, v in feeds.items()}
        if full:
            values["CuSeqlens"] = ort_value(np.array([0, max(0, T // 2), last], cu_np), cu_elem)
        live = T if not full else min(max(int(last), 0), T)
        try:
            (y,) = sess.run_with_ort_values(["Y"], values)
            out = host_float32(y, elem)
            if kind != "valid":
                print(f"linear call {call}: {kind} accepted (T={T}, N={n}, K={x_k}/{w_k})", flush=True)
                errors += 1
            elif out.shape != (T, n) or not np.isfinite(out[:live]).all():  # dead rows: never written
                print(f"linear call {call}: bad output (shape {out.shape}, live {live}, T={T})", flush=True)
                errors += 1
        except Exception as e:  # noqa: BLE001 - an error status is acceptable for invalid input only
            if kind == "valid":
                print(f"linear call {call}: unexpected error on valid input: {str(e).splitlines()[0]}", flush=True)
                errors += 1
        counts[f"linear_{kind}"] = counts.get(f"linear_{kind}", 0) + 1
    return counts, errors


GELU_BAD = ("n_not_16", "bias_shape")


def gelu_model(elem: int, *, bias: bool) -> bytes:
    """com.raggedvit::BiasGelu(X[, Bias]) -> Y over X [M, N]."""
    names = ["X", "Bias"] if bias else ["X"]
    node = helper.make_node("BiasGelu", names, ["Y"], domain="com.raggedvit")
    inputs = [helper.make_tensor_value_info("X", elem, ["M", "N"])]
    if bias:
        inputs.append(helper.make_tensor_value_info("Bias", elem, ["NB"]))
    out = helper.make_tensor_value_info("Y", elem, ["M", "N"])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    m = helper.make_model(helper.make_graph([node], "gelu", inputs, [out]), opset_imports=opsets)
    m.ir_version = 10
    return m.SerializeToString()


def gelu_calls(rng: np.random.Generator, calls: int, max_m: int) -> tuple[dict[str, int], int]:
    """BiasGelu calls on the CUDA EP (fp16 / bf16, with and without Bias; M from 0, both launch configs): valid calls
    must match a numpy GELU to the dtype's rounding; N not a multiple of 16 or a Bias of the wrong length must come
    back as errors, never faults. (counts by kind, unexpected errors)."""
    from math import erf

    erf_v = np.vectorize(erf)
    sessions = [(create_session(gelu_model(e, bias=b), "cuda", disable_cpu_fallback=True), e, b)
                for e in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for b in (True, False)]  # fmt: skip
    counts: dict[str, int] = {}
    errors = 0
    for call in range(calls):
        sess, elem, has_bias = sessions[call % len(sessions)]
        M = int(rng.integers(0, max_m + 1)) if rng.random() < 0.8 else int(rng.integers(1000, 1100))
        N = 16 * int(rng.integers(1, 17))
        kind = "valid" if rng.random() < 0.85 else str(rng.choice(GELU_BAD))
        if kind == "bias_shape" and not has_bias:
            kind = "valid"
        n, nb = N, N
        if kind == "n_not_16":
            n = nb = N + int(rng.integers(1, 16))
        elif kind == "bias_shape":
            nb = N + 16
        x = (3 * rng.standard_normal((M, n))).astype(np.float32)
        values = {"X": ort_value(x, elem)}
        b = rng.standard_normal(nb).astype(np.float32)
        if has_bias:
            values["Bias"] = ort_value(b, elem)
        try:
            (y,) = sess.run_with_ort_values(["Y"], values)
            out = host_float32(y, elem)
            if kind != "valid":
                print(f"gelu call {call}: {kind} accepted (M={M}, N={n}, bias {nb})", flush=True)
                errors += 1
                continue
            s = host_float32(values["X"], elem).astype(np.float64)
            if has_bias:
                s = s + host_float32(values["Bias"], elem).astype(np.float64)
            ref = 0.5 * s * (1.0 + erf_v(s / np.sqrt(2.0))) if s.size else s
            tol = 2.0**-8 if elem == TensorProto.BFLOAT16 else 2.0**-11
            bad = out.shape != (M, n) or not np.isfinite(out).all()
            if bad or (np.abs(out - ref) > tol * np.abs(ref) + 1e-6).any():
                print(f"gelu call {call}: bad output (shape {out.shape}, M={M}, N={n})", flush=True)
                errors += 1
        except Exception as e:  # noqa: BLE001 - an error status is acceptable for invalid input only
            if kind == "valid":
                print(f"gelu call {call}: unexpected error on valid input: {str(e).splitlines()[0]}", flush=True)
                errors += 1
        counts[f"gelu_{kind}"] = counts.get(f"gelu_{kind}", 0) + 1
    return counts, errors


NORM_BAD = ("d_not_16", "d_too_wide", "gamma_shape", "cu_shape")


def norm_model(elem: int, *, skip: bool, bias: bool, cu: int | None = None) -> bytes:
    """com.raggedvit::GatherLayerNorm(X, Index, Gamma, Beta[, Skip[, Bias[, CuSeqlens of type cu]]]) -> Normed, Sum
    (epsilon 1e-5); CuSeqlens is declared without a shape (bad ranks reach the op)."""
    names = ["X", "Index", "Gamma", "Beta", "Skip" if skip else "", "Bias" if bias else "",
             "" if cu is None else "CuSeqlens"]  # fmt: skip
    while names[-1] == "":
        names.pop()
    node = helper.make_node("GatherLayerNorm", names, ["Normed", "Sum"], domain="com.raggedvit", epsilon=1e-5)
    dims = {"X": ["T", "D"], "Index": ["R"], "Gamma": ["DG"], "Beta": ["D"], "Skip": ["T", "D"], "Bias": ["D"],
            "CuSeqlens": None}  # fmt: skip
    types = {"Index": TensorProto.INT64, "CuSeqlens": cu}
    inputs = [helper.make_tensor_value_info(n, types.get(n, elem), dims[n]) for n in names if n]
    outs = [helper.make_tensor_value_info(n, elem, ["R", "D"]) for n in ("Normed", "Sum")]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    m = helper.make_model(helper.make_graph([node], "norm", inputs, outs), opset_imports=opsets)
    m.ir_version = 10
    return m.SerializeToString()


def norm_calls(rng: np.random.Generator, calls: int, max_t: int) -> tuple[dict[str, int], int]:
    """GatherLayerNorm calls on the CUDA EP (module docstring). (counts by kind, unexpected errors)."""
    sessions = [(create_session(norm_model(e, skip=sk, bias=b, cu=cu), "cuda", disable_cpu_fallback=True), e, sk, b,
                 cu)
                for e in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for sk in (True, False)
                for b in (True, False) for cu in (None, TensorProto.INT32, TensorProto.INT64)]  # fmt: skip
    counts: dict[str, int] = {}
    errors = 0
    for call in range(calls):
        sess, elem, has_skip, has_bias, cu_elem = sessions[call % len(sessions)]
        T, R = int(rng.integers(0, max_t + 1)), int(rng.integers(0, max_t + 1))
        D = 16 * int(rng.integers(1, 257)) if rng.random() < 0.3 else int(rng.choice([384, 768, 1024, 1280, 16]))
        kind = "valid" if rng.random() < 0.85 else str(rng.choice(NORM_BAD))
        if kind == "cu_shape" and cu_elem is None:
            kind = "valid"  # no CuSeqlens input in this ORT session
        live = R
        if cu_elem is not None:
            cu_np = np.int32 if cu_elem == TensorProto.INT32 else np.int64
            info = np.iinfo(cu_np)
            last = int(rng.choice([R, int(rng.integers(0, R + 1)), int(rng.integers(0, R + 1)), R + 17, -5,
                                   int(info.max), int(info.min)]))  # fmt: skip
            cu = np.array([0, int(rng.integers(0, R + 1)), last], dtype=cu_np)
            if kind == "cu_shape":
                cu = np.zeros((1, 2), cu_np) if rng.random() < 0.5 else np.zeros(0, cu_np)
            live = min(max(last, 0), R)
        dg = D
        if kind == "d_not_16":
            D = dg = D + int(rng.integers(1, 16))
        elif kind == "d_too_wide":
            D = dg = 4096 + 16 * int(rng.integers(1, 8))
        elif kind == "gamma_shape":
            dg = D + 16
        index = rng.integers(-T - 5, T + 5, R) if R else np.zeros(0, np.int64)
        if R and rng.random() < 0.2:
            index[int(rng.integers(0, R))] = np.iinfo(np.int64).min if rng.random() < 0.5 else np.iinfo(np.int64).max
        x = (2 * rng.standard_normal((T, D)) + 0.5).astype(np.float32)
        values = {"X": ort_value(x, elem), "Index": ort_value(index.astype(np.int64), TensorProto.INT64),
                  "Gamma": ort_value((rng.random(dg) + 0.5).astype(np.float32), elem),
                  "Beta": ort_value(rng.standard_normal(D).astype(np.float32), elem)}  # fmt: skip
        if has_skip:
            values["Skip"] = ort_value(rng.standard_normal((T, D)).astype(np.float32), elem)
        if has_bias:
            values["Bias"] = ort_value(rng.standard_normal(D).astype(np.float32), elem)
        if cu_elem is not None:
            values["CuSeqlens"] = ort_value(cu, cu_elem)
        try:
            normed, total = sess.run_with_ort_values(["Normed", "Sum"], values)
            n_out, s_out = host_float32(normed, elem)[:live], host_float32(total, elem)[:live]  # dead rows: unwritten
            if kind != "valid":
                print(f"norm call {call}: {kind} accepted (T={T}, R={R}, D={D}, Gamma {dg})", flush=True)
                errors += 1
                continue
            host = {k: host_float32(v, elem).astype(np.float64) for k, v in values.items()
                    if k not in ("Index", "CuSeqlens")}  # fmt: skip
            i = np.where(index < 0, index + T, index)
            valid = (i >= 0) & (i < T)
            src = np.where(valid, i, 0)
            s = host["X"][src] if T else np.zeros((R, D))
            if has_skip and T:
                s = s + host["Skip"][src]
            if has_bias:
                s = s + host["Bias"]
            mean = s.mean(axis=1, keepdims=True) if D else s
            var = ((s - mean) ** 2).mean(axis=1, keepdims=True) if D else s
            ref_n = (s - mean) / np.sqrt(var + 1e-5) * host["Gamma"] + host["Beta"]
            ref_n, ref_s = np.where(valid[:, None], ref_n, 0.0)[:live], np.where(valid[:, None], s, 0.0)[:live]
            tol = 2.0**-7 if elem == TensorProto.BFLOAT16 else 2.0**-10
            bad = normed.shape() != [R, D] or not (np.isfinite(n_out).all() and np.isfinite(s_out).all())
            bad = bad or (np.abs(n_out - ref_n) > tol * (np.abs(ref_n) + 1)).any()
            bad = bad or (np.abs(s_out - ref_s) > tol * (np.abs(ref_s) + 1e-2)).any()
            if bad:
                print(f"norm call {call}: bad output (T={T}, R={R}, D={D}, live {live})", flush=True)
                errors += 1
        except Exception as e:  # noqa: BLE001 - an error status is acceptable for invalid input only
            if kind == "valid":
                print(f"norm call {call}: unexpected error on valid input: {str(e).splitlines()[0]}", flush=True)
                errors += 1
        counts[f"norm_{kind}"] = counts.get(f"norm_{kind}", 0) + 1
    return counts, errors


EMBED_PATCHES = (4, 8, 14, 16)
EMBED_BAD = ("n_not_16", "weight_rows", "prefix_width", "pos_rows", "images_rank")
# (image type, patch attribute) of sessions that must be refused: no patch, out of [1, 32768], double images
EMBED_CRAFTED = ((TensorProto.FLOAT, None), (TensorProto.FLOAT, 0), (TensorProto.FLOAT16, -1),
                 (TensorProto.FLOAT, 2**15 + 1), (TensorProto.DOUBLE, 16))  # fmt: skip
EMBED_NUMPY = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}


def embed_model(elem: int, patch: int | None) -> bytes:
    """com.raggedvit::PatchEmbed(Images, Weight float16, Prefix float, Pos float) -> Out float16, inputs declared
    without shapes (bad shapes reach the kernel); patch None leaves the attribute out."""
    names = ("Images", "Weight", "Prefix", "Pos")
    attrs = {} if patch is None else {"patch": patch}
    node = helper.make_node("PatchEmbed", list(names), ["Out"], domain="com.raggedvit", **attrs)
    types = {"Images": elem, "Weight": TensorProto.FLOAT16, "Prefix": TensorProto.FLOAT, "Pos": TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info(n, types[n], None) for n in names]
    out = helper.make_tensor_value_info("Out", TensorProto.FLOAT16, None)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    m = helper.make_model(helper.make_graph([node], "patch_embed", inputs, [out]), opset_imports=opsets)
    m.ir_version = 10
    return m.SerializeToString()


def embed_reference(feeds: dict[str, np.ndarray], patch: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 rows `rows` (flat indices over [B * (P + L)]) of Out, and of the sums of absolute terms (the scale of
    float32 rounding): prefix rows Prefix[j] + Pos[j]; patch row l of image b: its pixels rounded to float16
    (k = (c * patch + ky) * patch + kx) @ Weight + Pos[P + l]."""
    images, weight = feeds["Images"], feeds["Weight"].astype(np.float64)
    prefix, pos = feeds["Prefix"].astype(np.float64), feeds["Pos"].astype(np.float64)
    C, W = images.shape[1], images.shape[3]
    P, N = prefix.shape
    S, gw = pos.shape[0], max(W // patch, 1)  # (gw = 0: no patch rows to split)
    b, j = np.divmod(rows, S)
    head = j < P
    ref, mag = np.empty((len(rows), N)), np.empty((len(rows), N))
    ref[head] = prefix[j[head]] + pos[j[head]]
    mag[head] = np.abs(prefix[j[head]]) + np.abs(pos[j[head]])
    body = ~head
    py, px = np.divmod(j[body] - P, gw)
    ky, kx = np.divmod(np.arange(patch * patch), patch)
    a = images[b[body][:, None, None], np.arange(C)[None, :, None], (py * patch)[:, None, None] + ky,
               (px * patch)[:, None, None] + kx]  # fmt: skip
    a = a.astype(np.float16).astype(np.float64).reshape(int(body.sum()), C * patch * patch)
    ref[body] = a @ weight + pos[j[body]]
    mag[body] = np.abs(a) @ np.abs(weight) + np.abs(pos[j[body]])
    return ref, mag


def embed_feeds(
    rng: np.random.Generator, elem: int, shape: tuple[int, int, int, int], patch: int, P: int, N: int, kind: str
) -> dict[str, np.ndarray]:
    """Inputs of one call: Images [B, C, H, W] of `elem`, Weight [K, N], Prefix [P, N], Pos [P + L, N], one of them
    broken as `kind` says (n_not_16: N itself is the caller's)."""
    B, C, H, W = shape
    K, L = C * patch * patch, (H // patch) * (W // patch)
    images = (2 * rng.standard_normal(shape, dtype=np.float32)).astype(EMBED_NUMPY[elem])
    k = K + (16 if kind == "weight_rows" else 0)
    rows = P + L + (int(rng.choice([-1, 1])) if P + L and kind == "pos_rows" else 1 if kind == "pos_rows" else 0)
    return {
        "Images": images.reshape(B * C, H, W) if kind == "images_rank" else images,
        "Weight": (rng.standard_normal((k, N), dtype=np.float32) / np.sqrt(max(K, 1))).astype(np.float16),
        "Prefix": rng.standard_normal((P, N + (16 if kind == "prefix_width" else 0)), dtype=np.float32),
        "Pos": rng.standard_normal((rows, N), dtype=np.float32),
    }


def embed_side(rng: np.random.Generator, patch: int) -> int:
    """H or W of a call: 16..240, multiples of 16 (the aligned cubins at patch 16) or crops, a few below patch."""
    r = rng.random()
    if r < 0.05:
        return int(rng.integers(1, patch))  # no patch row / column: prefix rows only
    if r < 0.45:
        return 16 * int(rng.integers(1, 16))
    return int(rng.integers(16, 241))  # mostly not a multiple of patch


def embed_calls(rng: np.random.Generator, calls: int, ep: str = "cuda") -> tuple[dict[str, int], int]:
    """PatchEmbed calls on the CUDA EP (module docstring); ep "cpu" runs them on the CPU EP, whose kernel takes any
    N (n_not_16 calls are valid there). (counts by kind, unexpected errors)."""

    def session(elem: int, patch: int | None):  # refusals are counted here, not logged by ORT
        so = session_options(disable_cpu_fallback=ep == "cuda", log_severity=4)
        return create_session(embed_model(elem, patch), ep, options=so)

    counts: dict[str, int] = {}
    errors = 0
    for elem, patch in EMBED_CRAFTED:
        try:
            sess = session(elem, patch)
            sess.run(["Out"], embed_feeds(rng, elem, (2, 3, 32, 32), 16, 1, 64, "valid"))
            print(f"embed: image type {elem}, patch {patch!r}: accepted", flush=True)
            errors += 1
        except Exception:  # noqa: BLE001 - an error status is the expected outcome
            pass
        counts["embed_crafted"] = counts.get("embed_crafted", 0) + 1
    sessions = [(session(e, p), e, p) for e in (TensorProto.FLOAT, TensorProto.FLOAT16) for p in EMBED_PATCHES]
    for call in range(calls):
        sess, elem, patch = sessions[call % len(sessions)]
        r = rng.random()
        B = 0 if r < 0.05 else int(rng.integers(1, 9)) if r < 0.8 else int(rng.integers(9, 41))
        C, H, W, P = int(rng.integers(1, 5)), embed_side(rng, patch), embed_side(rng, patch), int(rng.integers(0, 3))
        N = 16 * int(rng.integers(1, 65)) if rng.random() < 0.7 else int(rng.choice([192, 384, 768, 1024]))
        S = P + (H // patch) * (W // patch)
        B = min(B, max(1, 2**24 // max(S * N, 1)), max(1, 2**23 // (C * H * W)))  # host memory of Out and Images
        kind = "valid" if rng.random() < 0.85 else str(rng.choice(EMBED_BAD))
        n = N + int(rng.integers(1, 16)) if kind == "n_not_16" else N
        valid = kind == "valid" or (kind == "n_not_16" and ep != "cuda")
        feeds = embed_feeds(rng, elem, (B, C, H, W), patch, P, n, kind)
        counts[f"embed_{kind}"] = counts.get(f"embed_{kind}", 0) + 1
        sizes = f"B={B}, C={C}, H={H}, W={W}, patch={patch}, P={P}, N={n}, image type {elem}"
        try:
            (out,) = sess.run(["Out"], feeds)
        except Exception as e:  # noqa: BLE001 - an error status is acceptable for invalid input only
            if valid:
                print(f"embed call {call}: unexpected error on valid input ({sizes}): {str(e).splitlines()[0]}",
                      flush=True)  # fmt: skip
                errors += 1
            continue
        if not valid:
            print(f"embed call {call}: {kind} accepted ({sizes})", flush=True)
            errors += 1
            continue
        if out.shape != (B, S, n) or out.dtype != np.float16 or not np.isfinite(out).all():
            print(f"embed call {call}: bad output {out.dtype} {out.shape} ({sizes})", flush=True)
            errors += 1
            continue
        if not out.size:
            continue
        # every row of small outputs; else the first and last rows of the first and last images, and random ones
        edges = np.minimum([0, P, S - 1, B * S - S, B * S - S + P, B * S - 1], B * S - 1)
        rows = np.arange(B * S) if B * S <= 64 else np.unique(np.concatenate([edges, rng.integers(0, B * S, 96)]))
        ref, mag = embed_reference(feeds, patch, rows)
        got = out.reshape(B * S, n)[rows].astype(np.float64)
        tol = 2.0**-11 * np.abs(ref) + 2 * (C * patch * patch + 4) * 2.0**-24 * (mag + 1) + 2.0**-24
        if (np.abs(got - ref) > tol).any():
            worst = float((np.abs(got - ref) / tol).max())
            print(f"embed call {call}: differs from the oracle ({sizes}): up to {worst:.2f}x the bound", flush=True)
            errors += 1
    return counts, errors


def crafted_sessions() -> tuple[int, int]:
    """(attempts, crashes-or-accepted): each crafted num_heads must be refused when the session is created or run."""
    bad = 0
    for heads in CRAFTED_HEADS:
        try:
            sess = create_session(model(TensorProto.FLOAT16, TensorProto.INT32, heads, 64, width=3 * 2 * 64), "cuda",
                                  disable_cpu_fallback=True)  # fmt: skip
            sess.run(None, {"qkv": np.zeros((4, 384), np.float16), "cu": np.array([0, 4], np.int32)})
            print(f"num_heads={heads}: accepted", flush=True)
            bad += 1
        except Exception as e:  # noqa: BLE001 - an error status is the expected outcome
            print(f"num_heads={heads}: refused ({str(e).splitlines()[0][:120]})", flush=True)
    return len(CRAFTED_HEADS), bad


def draw_cu(rng: np.random.Generator, T: int, kind: str) -> np.ndarray:
    B = int(rng.integers(1, 9))
    cu = np.concatenate([[0], np.sort(rng.integers(0, T + 1, B - 1)), [T]])
    if kind == "decreasing" and B >= 2:
        cu[1:-1] = cu[1:-1][::-1] + 1
    elif kind == "above_t":
        cu[rng.integers(1, B + 1)] = T + int(rng.integers(1, 1000))
    elif kind == "negative":
        cu[rng.integers(0, B + 1)] = -int(rng.integers(1, 1000))
    elif kind == "last_ne_t":
        cu[-1] = max(0, T - int(rng.integers(1, 5)))
    return cu


def main() -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000, help="attention and (every fifth) RaggedSelect calls")
    ap.add_argument("--max-t", type=int, default=300)
    ap.add_argument("--large-t-share", type=float, default=0.1, help="attention calls with T in LARGE_ATTENTION_T")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--linear-calls", type=int, default=300, help="RaggedLinear calls after the attention ones")
    ap.add_argument("--gelu-calls", type=int, default=1000, help="BiasGelu calls after the RaggedLinear ones")
    ap.add_argument("--norm-calls", type=int, default=1000, help="GatherLayerNorm calls after the BiasGelu ones")
    ap.add_argument("--embed-calls", type=int, default=1000, help="PatchEmbed calls after the GatherLayerNorm ones")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()

    def select_session(m: bytes, ep: str):  # refusals are counted here, not logged by ORT
        return create_session(m, ep, options=session_options(disable_cpu_fallback=ep == "cuda", log_severity=4))

    select = SelectCalls(rng, ("cuda", "cpu") if cuda else ("cpu",), select_session)
    if not cuda:
        print(f"onnxruntime {ort.__version__} has no CUDA EP: only the RaggedSelect calls run, on the CPU EP")
    crafted, errors = crafted_sessions() if cuda else (0, 0)
    sessions = []
    for npt, elem, cut, heads, dim in CASES if cuda else ():
        cu_elem = TensorProto.INT32 if cut == np.int32 else TensorProto.INT64
        sessions.append((create_session(model(elem, cu_elem, heads, dim), "cuda", disable_cpu_fallback=True),
                         create_session(model(elem, cu_elem, heads, dim, bias=True), "cuda", disable_cpu_fallback=True),
                         create_session(model(elem, cu_elem, heads, dim, pos=True), "cuda", disable_cpu_fallback=True),
                         npt, cut, heads, dim))  # fmt: skip
    kinds = ["valid"] * 5 + ["decreasing", "above_t", "negative", "last_ne_t"]
    counts: dict[str, int] = {"crafted_attributes": crafted} if cuda else {}
    t0 = time.time()
    for call in range(max(args.calls - crafted, 0)):
        if call % 5 == 2:  # a RaggedSelect call
            kind, failure = select.call()
            kind = f"select_{kind}"
            if failure:
                print(f"call {call}: {kind}: {failure}", flush=True)
                errors += 1
        elif not cuda:
            continue
        else:
            large = rng.random() < args.large_t_share
            kind, failed = attention_call(rng, call, sessions[call % len(sessions)], kinds, args.max_t, large)
            errors += failed
        counts[kind] = counts.get(kind, 0) + 1
        if (call + 1) % 100 == 0:
            print(f"{call + 1} calls ({time.time() - t0:.1f} s)", flush=True)
    if cuda:
        linear_counts, linear_errors = linear_calls(rng, args.linear_calls, args.max_t)
        counts.update(linear_counts)
        errors += linear_errors
        gelu_counts, gelu_errors = gelu_calls(rng, args.gelu_calls, 2 * args.max_t)
        counts.update(gelu_counts)
        errors += gelu_errors
        norm_counts, norm_errors = norm_calls(rng, args.norm_calls, args.max_t)
        counts.update(norm_counts)
        errors += norm_errors
        embed_counts, embed_errors = embed_calls(rng, args.embed_calls)
        counts.update(embed_counts)
        errors += embed_errors
    total = sum(counts.values())
    where = "CUDA-EP" if cuda else "CPU-EP"
    print(f"memcheck fuzz: {total} {where} calls {counts}, {errors} unexpected errors, {time.time() - t0:.1f} s")
    return 1 if errors else 0


def attention_call(
    rng: np.random.Generator, call: int, session: tuple, kinds: list[str], max_t: int, large: bool = False
) -> tuple[str, int]:
    """One RaggedAttention call on the CUDA EP: (kind, 1 on an unexpected error else 0); T in LARGE_ATTENTION_T
    when `large`, else up to max_t."""
    sess, sess_bias, sess_pos, npt, cut, heads, dim = session
    lo, hi = LARGE_ATTENTION_T if large else (0, max_t)
    T = int(rng.integers(lo, hi + 1))
    kind = kinds[int(rng.integers(0, len(kinds)))]
    cu = draw_cu(rng, T, kind).astype(cut)
    qkv = rng.standard_normal((T, 3 * heads * dim)).astype(npt)
    feeds = {"qkv": qkv, "cu": cu}
    if call % 10 == 9:  # with a bias: the right one, or a wrong length / type (an error, never a fault)
        sess = sess_bias
        which = int(rng.integers(0, 3))
        width = 3 * heads * dim + (0 if which != 1 else int(rng.integers(1, 64)))
        feeds["bias"] = rng.standard_normal(width).astype(npt if which != 2 else np.float64)
        if which and kind == "valid":
            kind = "bad_bias"
    elif call % 5 in (3, 4):  # relative position bias: right shapes, or a wrong table / token_pos length
        sess = sess_pos
        grid, p = POS
        R = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
        which = int(rng.integers(0, 8))
        table = (heads, R + (1 if which == 1 else 0))
        n_tokens = T + (int(rng.integers(1, 4)) if which == 2 else 0)
        tokens = rng.integers(0, p + grid[0] * grid[1], n_tokens)
        odd = rng.random(n_tokens) < 0.2
        tokens[odd] = rng.choice(POS_ODD, int(odd.sum()))
        feeds["pos_table"] = rng.standard_normal(table).astype(np.float32)
        feeds["token_pos"] = tokens.astype(cut)
        if which in (1, 2) and kind == "valid":
            kind = "bad_pos"
    try:
        out, cls = sess.run(None, feeds)
        if kind == "valid" and not (np.isfinite(out).all() and np.isfinite(cls).all()):
            print(f"call {call}: non-finite output for valid cu {cu.tolist()} T={T}", flush=True)
            return kind, 1
    except Exception as e:  # noqa: BLE001 - an error status is acceptable for invalid input only
        if kind == "valid":
            print(f"call {call}: unexpected error on valid input: {str(e).splitlines()[0]}", flush=True)
            return kind, 1
    return kind, 0


if __name__ == "__main__":
    sys.exit(main())
