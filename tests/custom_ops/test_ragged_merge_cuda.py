"""RaggedMerge on a GPU: (a) the JIT Triton kernel (`_merge_launch.launch_merge` on CUDA tensors) and (b) the CUDA EP
node (the AOT cubins of libraggedvit_ort.so through onnxruntime-gpu) against `merge_tokens_reference` (float32 on
the CPU) at deit_small / deit_base shapes, B = 1, 32, 128, float16 and float32 (the JIT also bfloat16), with and
without a class token; the EP also bit-identical across two runs, a wide image (n = 577: the width-512 cubins), and
the fused attention residual (skip, skip_bias) against the reference and against the CUDA EP's own two Adds.
GPU only.

Inputs: tests/support/merge_kernel_cases.py's planted keys. src, sizes and rows are compared exactly (x within
float32 rounding or one ulp of float16) on the images whose decisions are clear of float32 rounding
(`decision_margins` > MARGIN: at least 85% of them; two float32 computations of one cosine differ in the last
bits, so a near tie may go either way); cu and score on every image.

    python -m pytest -m gpu tests/custom_ops/test_ragged_merge_cuda.py
"""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.pruning.merge import merge_tokens_reference, merged_count
from tests.support.merge_kernel_cases import (
    MARGIN,
    MergeCase,
    compare_merge,
    decision_margins,
    make_merge_inputs,
    make_skip_inputs,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
needs_ort_gpu = pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"
)

MODELS = {"deit_small": (384, 6), "deit_base": (768, 12)}  # C, H (Dh = 64, n = 197, one class token, r = 8)
DTYPE_IDS = {torch.float16: "fp16", torch.float32: "fp32"}  # the CUDA EP's (the JIT launch also takes bfloat16)
JIT_DTYPE_IDS = {**DTYPE_IDS, torch.bfloat16: "bf16"}
_CHECKS = ("cu", "src", "shapes", "x", "size", "key_bias", "score")


def _case(model: str, B: int, dtype: torch.dtype, class_token: bool, *, n: int = 197, size: str = "int") -> MergeCase:
    C, H = MODELS[model]
    return MergeCase(f"{model}-b{B}", B, n, H, C // H, 1, 8, class_token, dtype, size=size)


def _check(got, case: MergeCase, inputs, skip: dict | None = None) -> None:
    """got equals the CPU reference on the images whose decisions are safe (>= 85% of them), cu and score on all."""
    x, qkv, bias, size, cu = inputs
    ref = merge_tokens_reference(x, qkv, bias, size, cu, case.H, case.p, case.r, case.class_token, **(skip or {}))
    safe = decision_margins(qkv, bias, case.B, case.n, case.H, case.p, case.r, case.class_token) > MARGIN
    assert safe.float().mean() >= 0.85, f"only {int(safe.sum())} of {case.B} images clear of near ties"
    m = case.n - merged_count(case.n, case.p, case.r)
    res = compare_merge(got, ref, case.dtype, case.size, rows=safe.repeat_interleave(m))
    assert res == dict.fromkeys(_CHECKS, True), res


@pytest.mark.parametrize("class_token", [True, False], ids=["cls", "no-cls"])
@pytest.mark.parametrize("dtype", list(JIT_DTYPE_IDS), ids=JIT_DTYPE_IDS.get)
@pytest.mark.parametrize("B", [1, 32, 128])
@pytest.mark.parametrize("model", list(MODELS))
def test_jit_kernel_equals_reference(model, B, dtype, class_token):
    from raggedvit.kernels._merge_launch import launch_merge

    case = _case(model, B, dtype, class_token)
    inputs = make_merge_inputs(case, seed=B)
    x, qkv, bias, size, cu = (t.cuda() if t is not None else None for t in inputs)
    got = launch_merge(x, qkv, bias, size, cu, case.H, case.p, case.r, case.class_token)
    torch.cuda.synchronize()
    _check([t.cpu() for t in got], case, inputs)
    again = launch_merge(x, qkv, bias, size, cu, case.H, case.p, case.r, case.class_token)
    for a, b in zip(got, again):
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                           b.view(torch.uint8) if b.is_floating_point() else b)  # fmt: skip


@pytest.mark.parametrize("dtype", list(DTYPE_IDS), ids=DTYPE_IDS.get)
def test_jit_kernel_wide_images_and_no_bias_no_size(dtype):
    """n = 577 (384 px: NP 512, several A and B tiles), r = 40 (three chunks of merged rows), no bias, no size."""
    from raggedvit.kernels._merge_launch import launch_merge

    case = MergeCase("n577", 4, 577, 6, 64, 1, 40, False, dtype, bias=False, size="none")
    inputs = make_merge_inputs(case, seed=5)
    cuda = [t.cuda() if t is not None else None for t in inputs]
    got = launch_merge(*cuda, case.H, case.p, case.r, case.class_token)
    _check([t.cpu() for t in got], case, inputs)


def _run_ep(case: MergeCase, inputs, skip: dict | None = None, *, adds: bool = False) -> list[torch.Tensor]:
    """The node on the CUDA EP (no CPU fallback); skip: make_skip_inputs' tensors, as the node's inputs or (adds) as
    two Adds before it."""
    from raggedvit.runtime import create_session, run_with_iobinding
    from tests.support.ort_models import MERGE_OUTPUTS, merge_model

    x, qkv, bias, size, cu = inputs
    skip = skip or {}
    elem = TensorProto.FLOAT16 if case.dtype == torch.float16 else TensorProto.FLOAT
    attrs = {"num_heads": case.H, "num_prefix": case.p, "r": case.r, "class_token": int(case.class_token)}
    model = merge_model(elem, attrs, qkv_bias=bias is not None, size=size is not None, skip="skip" in skip,
                        skip_bias="skip_bias" in skip, adds=adds)  # fmt: skip
    sess = create_session(model, "cuda", disable_cpu_fallback=True)
    feeds = {k: v.cuda() for k, v in zip(("x", "qkv", "qkv_bias", "size", "cu"), inputs) if v is not None}
    feeds |= {k: v.cuda() for k, v in skip.items()}
    B, n = case.B, case.n
    m, n_a = n - merged_count(n, case.p, case.r), (n - (case.p + case.p % 2) + 1) // 2
    dev, f32, i64 = "cuda", torch.float32, torch.int64
    shapes = ((B * m, x.shape[1]), (B * m,), (B + 1,), (B * m,), (B * m,), (B * n_a,))
    dtypes = (case.dtype, f32, i64, i64, f32, f32)
    outs = {k: torch.full(s, -7, dtype=d, device=dev) for k, s, d in zip(MERGE_OUTPUTS, shapes, dtypes)}
    run_with_iobinding(sess, feeds, outs)
    torch.cuda.synchronize()
    return [t.cpu() for t in outs.values()]


@needs_ort_gpu
@pytest.mark.parametrize("class_token", [True, False], ids=["cls", "no-cls"])
@pytest.mark.parametrize("dtype", list(DTYPE_IDS), ids=DTYPE_IDS.get)
@pytest.mark.parametrize("B", [1, 32, 128])
@pytest.mark.parametrize("model", list(MODELS))
def test_cuda_ep_equals_reference_and_repeats_bits(ort_library, model, B, dtype, class_token):
    case = _case(model, B, dtype, class_token)
    inputs = make_merge_inputs(case, seed=B + 1)
    got = _run_ep(case, inputs)
    _check(got, case, inputs)
    again = _run_ep(case, inputs)
    for a, b in zip(got, again):
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                           b.view(torch.uint8) if b.is_floating_point() else b)  # fmt: skip


@needs_ort_gpu
@pytest.mark.parametrize("dtype", list(DTYPE_IDS), ids=DTYPE_IDS.get)
def test_cuda_ep_wide_images_without_bias_and_size(ort_library, dtype):
    case = MergeCase("n577", 4, 577, 6, 64, 1, 40, True, dtype, bias=False, size="none")
    inputs = make_merge_inputs(case, seed=6)
    _check(_run_ep(case, inputs), case, inputs)


@needs_ort_gpu
@pytest.mark.parametrize("skip", ["skip", "skip-bias"])
@pytest.mark.parametrize("dtype", list(DTYPE_IDS), ids=DTYPE_IDS.get)
def test_cuda_ep_fused_residual_equals_reference_and_the_adds(ort_library, dtype, skip):
    """skip (and skip_bias): the node equals the reference on x + (skip + skip_bias), and gives the bits of the CUDA
    EP's own Add(x, Add(skip, skip_bias)) before an unfused node (each sum rounded to x's type, as its Adds do)."""
    case = _case("deit_small", 32, dtype, True)._replace(skip=skip)
    inputs = make_merge_inputs(case, seed=9)
    extra = make_skip_inputs(case, seed=9)
    got = _run_ep(case, inputs, extra)
    _check(got, case, inputs, extra)
    unfused = _run_ep(case, inputs, extra, adds=True)
    for a, b in zip(got, unfused):
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                           b.view(torch.uint8) if b.is_floating_point() else b)  # fmt: skip
