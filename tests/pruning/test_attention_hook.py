"""PrunedViT(attention=...): another ragged attention implementation in every block, same results."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.kernels import ragged_attention_reference
from raggedvit.pruning import PrunedViT, PruneSpec, packed_block_forward
from tests.support.testing import assert_close


class CountingReference:
    """The float32 reference with the hook signature; counts calls and cls_attn requests."""

    def __init__(self) -> None:
        self.calls = 0
        self.cls_calls = 0

    def __call__(self, qkv, cu_seqlens, num_heads, *, scale, max_seqlen, return_cls_attn):
        assert isinstance(max_seqlen, int) and max_seqlen >= 1
        self.calls += 1
        self.cls_calls += int(return_cls_attn)
        return ragged_attention_reference(qkv, cu_seqlens, num_heads, scale=scale, return_cls_attn=return_cls_attn)


def padded_sdpa_hook(qkv, cu_seqlens, num_heads, *, scale, max_seqlen, return_cls_attn):
    """Hook without host reads (exportable): gather each sequence into [B, W] slots with W = max_seqlen, masked
    SDPA, scatter back. qkv [T, 3*H*D] -> out [T, H*D] (, cls_attn [T] float32)."""
    T = qkv.shape[0]
    H, W = num_heads, max_seqlen
    D = qkv.shape[1] // (3 * H)
    n = cu_seqlens[1:] - cu_seqlens[:-1]  # [B]
    slot = torch.arange(W, device=qkv.device)
    valid = slot < n[:, None]  # [B, W]
    rows = torch.where(valid, cu_seqlens[:-1, None] + slot, T)  # [B, W]; T = a zero row
    padded = torch.cat((qkv, qkv.new_zeros(1, qkv.shape[1])))[rows]  # [B, W, 3*H*D]
    q, k, v = padded.view(-1, W, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, W, D]
    mask = valid[:, None, None, :]
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, H, W, D]
    flat = o.permute(0, 2, 1, 3).reshape(-1, H * D)  # [B*W, H*D]
    out = qkv.new_zeros(T + 1, H * D).index_copy(0, rows.reshape(-1), flat)[:T]
    if not return_cls_attn:
        return out
    s = (q[:, :, :1].float() * scale) @ k.float().transpose(-2, -1)  # [B, H, 1, W]
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)[:, :, 0].mean(dim=1)  # [B, W]
    cls_attn = qkv.new_zeros(T + 1, dtype=torch.float32).index_copy(0, rows.reshape(-1), p.reshape(-1))[:T]
    return out, cls_attn


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(
    "spec",
    [PruneSpec("topk-l2", prune_at=(1, 3), keep=0.6), PruneSpec("cls-mass", prune_at=(1, 2), mass=0.8)],
    ids=["topk-l2", "cls-mass"],
)
def test_hook_replaces_the_op_with_same_results(spec: PruneSpec) -> None:
    vit, images = get_model("deit_tiny_d4"), get_images("deit_tiny_d4")
    hook = CountingReference()
    want = PrunedViT(vit, spec)(images)
    got = PrunedViT(vit, spec, attention=hook)(images)
    assert hook.calls == len(vit.blocks)
    assert hook.cls_calls == (len(spec.prune_at) if spec.needs_cls_attn else 0)
    assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5, name="logits with hook")
    assert torch.equal(got.token_counts, want.token_counts)


@pytest.mark.usefixtures("no_grad")
def test_block_forward_hook_and_default() -> None:
    blk = get_model("deit_tiny_d4").blocks[0]
    x = torch.randn(7, blk.attn.qkv.in_features)
    cu = torch.tensor([0, 3, 7])
    hook = CountingReference()
    got, cls_got = packed_block_forward(blk, x, cu, max_seqlen=4, return_cls_attn=True, attention=hook)
    want, cls_want = packed_block_forward(blk, x, cu, max_seqlen=4, return_cls_attn=True)
    assert hook.calls == 1
    assert_close(got, want, rtol=1e-5, atol=1e-6, name="block out")
    assert_close(cls_got, cls_want, rtol=1e-5, atol=1e-6, name="cls_attn")


@pytest.mark.usefixtures("no_grad")
def test_export_with_hook() -> None:
    vit, images = get_model("deit_tiny_d4"), get_images("deit_tiny_d4")
    spec = PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7)
    model = PrunedViT(vit, spec, attention=padded_sdpa_hook).eval()
    program = torch.export.export(model, (images,))
    assert "ragged_attention" not in str(program.graph_module.code)  # the hook, not the op, was traced
    got, want = program.module()(images), PrunedViT(vit, spec)(images)
    assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5, name="exported logits with hook")
    assert torch.equal(got.token_counts, want.token_counts)
