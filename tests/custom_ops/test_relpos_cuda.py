"""RaggedAttention's relative position bias on ORT's CUDA EP (the AOT HAS_POS cubins) vs the float64 reference.
GPU only; every session sets session.disable_cpu_ep_fallback=1."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
from _relpos_cases import check, pos_model, relpos_inputs, run_pos

from raggedvit.kernels.reference import pos_table_size
from tests.support.ort_models import DTYPES, random_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"),
]

OUT_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("with_cls", [True, False])
def test_cuda_ep_matches_reference(ort_library, gen, dtype, cu_dtype, D, with_cls):
    H = 3
    qkv, cu = random_batch(gen, 9, 200, H, D, dtype, cu_dtype)
    lengths = (cu[1:] - cu[:-1]).tolist()
    pos = relpos_inputs(lengths, H, (14, 14), 1, gen, cu_dtype=cu_dtype, odd_rows=6)
    model = pos_model(dtype, cu_dtype, H, pos, cls_attn=with_cls)
    got = run_pos("cuda", model, qkv, cu, pos, cls_attn=with_cls)
    check(got, qkv, cu, H, pos, rtol=OUT_TOL[dtype])


def test_cuda_ep_large_batch_bias_and_no_prefix(ort_library, gen):
    """T >= 2048 (the large-T config) with a qkv bias, p = 0 and a non-square grid."""
    H, D = 12, 64
    qkv, cu = random_batch(gen, 24, 197, H, D, torch.float16, torch.int64, allow_empty=False)
    bias = torch.randn(3 * H * D, generator=gen).half()
    pos = relpos_inputs((cu[1:] - cu[:-1]).tolist(), H, (12, 17), 0, gen, cu_dtype=torch.int64, odd_rows=10)
    got = run_pos("cuda", pos_model(torch.float16, torch.int64, H, pos, bias=True), qkv, cu, pos, bias=bias)
    check(got, qkv, cu, H, pos, rtol=OUT_TOL[torch.float16], bias=bias)


def test_cuda_ep_bad_table_is_a_status(ort_library, gen):
    qkv, cu = random_batch(gen, 2, 20, 2, 32, torch.float32, torch.int64, allow_empty=False)
    pos = relpos_inputs((cu[1:] - cu[:-1]).tolist(), 2, (3, 3), 1, gen, cu_dtype=torch.int64)
    pos["pos_table"] = torch.zeros(2, pos_table_size((3, 3)) + 1)
    with pytest.raises(Exception, match=r"input 'pos_table' must be \[num_heads"):
        run_pos("cuda", pos_model(torch.float32, torch.int64, 2, pos), qkv, cu, pos)
