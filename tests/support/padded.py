"""Padded reference of the pruned ViT: [B, W, C] tokens with a key-padding mask, no packing.

Same function as `PrunedViT.forward_packed` (same selection code), computed the straightforward way; also the
"padded attention" baseline of the benchmarks (`attention="sdpa"`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block, VisionTransformer

from raggedvit.pruning._model import check_vit, classify, embed_tokens, is_distilled
from raggedvit.pruning.packed import PrunedOutput
from raggedvit.pruning.packed_block import attn_residual, block_tail, mlp_residual
from raggedvit.pruning.select import select_tokens
from raggedvit.pruning.spec import PruneSpec

__all__ = ["padded_block_forward", "padded_prune_stage", "padded_reference_forward"]

ATTENTIONS = ("eager", "sdpa")


def _masked_attention(q, k, v, valid, scale, attention: str, need_cls: bool):
    """q, k, v [B, H, W, D]; valid [B, W] bool -> out [B, H, W, D], cls_attn [B, W] float32 or None."""
    key_mask = valid[:, None, None, :]  # [B, 1, 1, W]
    cls_attn = None
    if attention == "eager":
        s = (q.float() * scale) @ k.float().transpose(-2, -1)  # [B, H, W, W]
        p = torch.softmax(s.masked_fill(~key_mask, float("-inf")), dim=-1)
        out = (p @ v.float()).to(q.dtype)
        if need_cls:
            cls_attn = p[:, :, 0, :].mean(dim=1)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=scale)
        if need_cls:
            s0 = (q[:, :, :1].float() * scale) @ k.float().transpose(-2, -1)  # [B, H, 1, W]
            cls_attn = torch.softmax(s0.masked_fill(~key_mask, float("-inf")), dim=-1)[:, :, 0].mean(dim=1)
    return out, cls_attn


def padded_block_forward(
    block: Block,
    x: torch.Tensor,
    valid: torch.Tensor,
    *,
    attention: str = "eager",
    return_cls_attn: bool = False,
    halves: bool = False,
):
    """timm Block on padded tokens x [B, W, C] with key-padding mask valid [B, W] -> x' (, cls_attn [B, W]).
    halves: stop after the attention residual, returning (x after it, cls_attn): an in-block stage runs there, then
    mlp_residual (EViT's block)."""
    attn = block.attn
    B, W, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    h = block.norm1(x)
    q, k, v = attn.qkv(h).reshape(B, W, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, W, D]
    q, k = attn.q_norm(q), attn.k_norm(k)
    o, cls_attn = _masked_attention(q, k, v, valid, attn.scale, attention, return_cls_attn)
    o = o.transpose(1, 2).reshape(B, W, H * D)
    if halves:
        return attn_residual(block, x, h, o), cls_attn
    x = block_tail(block, x, h, o)
    return (x, cls_attn) if return_cls_attn else x


def padded_prune_stage(x, n, scores, cls_attn, num_prefix: int, spec: PruneSpec, *, shrink: bool):
    """One prune stage on padded tokens.

    Args:
        x: [B, W, C] tokens, image b valid in [0, n_b).
        n: [B] int64.
        scores: [B, W] float32 per-slot scores.
        cls_attn: [B, W] float32 (evit fuse), else None.
        shrink: trim the padded width to the largest new count (a host read; the result is the same).

    Returns:
        (x' [B, W', C], n' [B], token slot map [B, W'] int64: old slot of each new slot, W for a fused token).
    """
    B, W, C = x.shape
    idx = torch.arange(W, device=x.device)
    S = torch.where((idx >= num_prefix) & (idx < n.unsqueeze(1)), scores.float(), float("-inf"))
    keep = select_tokens(S, n, num_prefix, spec).keep
    x_src = x
    if spec.fuse:
        dropped = (~keep) & (idx < n.unsqueeze(1)) & (idx >= num_prefix)
        w = cls_attn.float() * dropped.float()  # [B, W]
        fused = (w.unsqueeze(2) * x.float()).sum(1)  # EViT: the attention-weighted sum, not renormalised
        keep = torch.cat((keep, torch.ones(B, 1, dtype=torch.bool, device=x.device)), dim=1)
        x_src = torch.cat((x, fused.to(x.dtype).unsqueeze(1)), dim=1)
    n_new = keep.sum(dim=1)
    width = int(n_new.max()) if shrink else keep.shape[1]
    b, i = torch.nonzero(keep, as_tuple=True)
    pos_new = (torch.cumsum(keep.to(torch.int64), dim=1) - 1)[b, i]
    out = x.new_zeros(B, width, C)
    out[b, pos_new] = x_src[b, i]
    slots = torch.full((B, width), -1, dtype=torch.int64, device=x.device)
    slots[b, pos_new] = i
    return out, n_new, slots


def _padded_head(vit: VisionTransformer, x: torch.Tensor, n: torch.Tensor, num_prefix: int) -> torch.Tensor:
    x = vit.norm(x)
    second = x[:, 1] if is_distilled(vit) else None
    pooled = None
    idx = torch.arange(x.shape[1], device=x.device)
    lo = 0 if vit.pool_include_prefix else num_prefix
    if vit.attn_pool is not None:  # timm's own module with an additive key mask over the padding
        mask = torch.where(idx[lo:] < n.unsqueeze(1), 0.0, float("-inf"))  # [B, W - lo]
        pooled = vit.attn_pool(x[:, lo:], attn_mask=mask[:, None, None, :].to(x.dtype))
    elif vit.global_pool != "token":
        include = ((idx >= lo) & (idx < n.unsqueeze(1))).unsqueeze(2)  # [B, W, 1]
        mean = (x * include).sum(1) / include.sum(1).to(x.dtype)
        amax = x.masked_fill(~include, float("-inf")).amax(1)
        pooled = {"avg": mean, "max": amax, "avgmax": 0.5 * (amax + mean)}[vit.global_pool]
    return classify(vit, x[:, 0], second, pooled)


@torch.no_grad()
def padded_reference_forward(
    vit: VisionTransformer,
    spec: PruneSpec,
    images: torch.Tensor,
    *,
    attention: str = "eager",
    shrink: bool = True,
) -> PrunedOutput:
    """The pruned forward on padded tokens with masking.

    Args:
        vit: timm VisionTransformer (eval mode).
        spec: pruning spec.
        images: [B, 3, S, S].
        attention: "eager" (explicit masked softmax) or "sdpa" (F.scaled_dot_product_attention with a boolean
            key-padding mask; cls attention from q_cls and k separately).
        shrink: after each stage pad only to the batch's largest token count.

    Returns:
        PrunedOutput: logits [B, classes], token_counts [B, stages]; token_index / cu_seqlens per stage in the
        packed layout (for comparison with the packed forward).
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    check_vit(vit)
    spec.check_model(depth=len(vit.blocks), has_class_token=vit.cls_token is not None)
    p = int(vit.num_prefix_tokens)
    x = embed_tokens(vit, images)
    B, N, _ = x.shape
    n = torch.full((B,), N, dtype=torch.int64, device=x.device)
    token_index = torch.arange(N, device=x.device).expand(B, N)
    stages = set(spec.prune_at)
    counts, kept_index, kept_cu = [], [], []
    cls_attn = None
    inside = spec.descriptor.where == "inside"  # evit: the stage runs in its block, after the attention residual

    def stage(x, n, token_index, scores, cls_attn):
        x, n, slots = padded_prune_stage(x, n, scores, cls_attn, p, spec, shrink=shrink)
        ext = torch.cat((token_index, torch.full((B, 1), -1, device=x.device, dtype=torch.int64)), dim=1)
        token_index = torch.gather(ext, 1, slots.clamp_min(0))  # slot W (fused) -> -1
        valid = torch.arange(x.shape[1], device=x.device).unsqueeze(0) < n.unsqueeze(1)
        counts.append(n)
        kept_index.append(token_index[valid])
        kept_cu.append(torch.cat((n.new_zeros(1), torch.cumsum(n, 0))))
        return x, n, token_index

    for bi, blk in enumerate(vit.blocks):
        if bi in stages and not inside:
            scores = torch.linalg.vector_norm(x.float(), dim=-1) if spec.policy == "topk-l2" else cls_attn
            x, n, token_index = stage(x, n, token_index, scores, cls_attn)
        valid = torch.arange(x.shape[1], device=x.device).unsqueeze(0) < n.unsqueeze(1)
        if bi in stages and inside:
            x, cls_attn = padded_block_forward(blk, x, valid, attention=attention, return_cls_attn=True, halves=True)
            x, n, token_index = stage(x, n, token_index, cls_attn, cls_attn)
            x = mlp_residual(blk, x)
            continue
        need_cls = spec.needs_cls_attn and (bi + 1) in stages and not inside
        out = padded_block_forward(blk, x, valid, attention=attention, return_cls_attn=need_cls)
        x, cls_attn = out if need_cls else (out, None)
    logits = _padded_head(vit, x, n, p)
    token_counts = torch.stack(counts, dim=1) if counts else torch.zeros(B, 0, dtype=torch.int64, device=x.device)
    return PrunedOutput(logits, token_counts, tuple(kept_index), tuple(kept_cu))
