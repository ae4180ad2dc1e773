"""GPU checks of benchmarks.e2e's torch_varlen peer: the varlen hook equals raggedvit's op (out and cls_attn)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.e2e.varlen import VarlenAttention, pick_varlen_core
from raggedvit.kernels import ragged_attention
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit
from tests.support.testing import assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("lengths", [[197, 99, 1, 150], [577], [40] * 16])
def test_varlen_hook_matches_ragged_op(lengths: list[int]) -> None:
    H, D = 12, 64
    g = torch.Generator().manual_seed(len(lengths))
    T = sum(lengths)
    qkv = torch.randn(T, 3 * H * D, generator=g).to("cuda", torch.float16)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    core, note = pick_varlen_core(torch.device("cuda"), torch.float16)
    hook = VarlenAttention(core)
    out, cls_attn = hook(qkv, cu, H, scale=D**-0.5, max_seqlen=max(lengths) + 3, return_cls_attn=True)
    want, want_cls = ragged_attention(qkv, cu, H, return_cls_attn=True)
    assert_close(out, want, rtol=4e-3, name=f"varlen out ({note})")
    assert_close(cls_attn, want_cls, rtol=1e-3, atol=1e-6, name="varlen cls_attn")


@torch.inference_mode()
def test_pruned_vit_with_varlen_hook() -> None:
    vit, _ = load_vit("deit_small_patch16_224", seed=0, model_kwargs={"depth": 6})
    vit = vit.to("cuda", torch.float16)
    images = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(0)).to("cuda", torch.float16)
    core, _ = pick_varlen_core(torch.device("cuda"), torch.float16)
    for spec in (PruneSpec("topk-l2", prune_at=(2,), keep=0.5), PruneSpec("cls-mass", prune_at=(1, 3), mass=0.9)):
        got = PrunedViT(vit, spec, attention=VarlenAttention(core))(images)
        want = PrunedViT(vit, spec)(images)
        same = (got.token_counts == want.token_counts).all(dim=1)  # [B]; fp16 near-ties may flip one image
        assert int(same.sum()) >= images.shape[0] - 1
        assert_close(got.logits[same].float(), want.logits[same].float(), rtol=2e-2, name=f"{spec.policy} logits")
