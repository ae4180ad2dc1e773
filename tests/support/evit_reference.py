"""EViT (Liang et al., "Not All Patches are What You Need", ICLR 2022) on a timm VisionTransformer, written from the
published code as an independent test oracle.

Source: github.com/youweiliang/evit, `evit.py` (classes `Attention`, `Block`, `EViT`, the model functions
`deit_*_shrink_base`) and `helpers.py::complement_idx`. Read to learn the semantics; no code copied, no raggedvit
code used: padded [B, N, C] tensors and the timm model's own modules.

Semantics, each with where it comes from:
- Where: a stage runs INSIDE its block, after the attention residual `x = x + attn(norm1(x))` and before the MLP
  residual; the MLP of the pruning block runs on the kept rows (+ the fused row) only (`Block.forward`).
- Which blocks: `drop_loc` (0-based block indices, default (3, 6, 9)) get `keep_rate`, every other block 1
  (`deit_small_patch16_shrink_base`: `keep_rate[loc] = base_keep_rate`; the CLI default `--drop_loc '(3, 6, 9)'`).
- Ranking: the head-mean attention of the class token (query row 0) to every non-class token (key columns 1:) of
  that same block, taken from the softmax over ALL N keys (the class token's self-attention is not removed, the
  N - 1 weights are not renormalised) (`Attention.forward`: `attn[:, :, 0, 1:].mean(dim=1)`).
- Count: `left = math.ceil(keep_rate * (N - 1))` in Python (float64) arithmetic, where N counts every row entering
  the block: the class token, the patch tokens left and an earlier stage's fused token. If `left == N - 1`, or
  keep_rate is 1, nothing is dropped and no fused token is made (`Attention.forward`: the early return).
- Order: the kept tokens follow the class token in DESCENDING class attention (`torch.topk(..., sorted=True)`),
  not in position order (`Attention.forward`, gathered by `Block.forward`). Exact ties: torch.topk's order.
- Fuse (`fuse_token=True`): one extra token, the weighted SUM of the dropped tokens' rows of x (after the attention
  residual) with their class-attention weights, no renormalisation, appended LAST (`Block.forward`:
  `torch.sum(non_topk * non_topk_attn.unsqueeze(-1), dim=1)`, `torch.cat([x[:, 0:1], x_others, extra_token])`;
  the dropped set is `helpers.py::complement_idx`). In later stages it is an ordinary candidate token: it is ranked,
  kept, or dropped and summed into the next fused token like any other.
- Head: the timm model's own `norm` and `forward_head` (EViT: `x = self.norm(x)`, `self.head(x[:, 0])`).

Beyond the published code (which has one class token and no LayerScale, q/k norms or registers): the timm block's
ls1 / ls2, q_norm / k_norm, attention norm and gate are applied as timm applies them. A distillation token or
registers (num_prefix_tokens > 1) are never candidates: they stay in place after the class token, and N - 1 above
becomes N - num_prefix_tokens. (In EViT's own code a distillation token would be an ordinary prunable token of
x[:, 1:]; its DistilledEViT does not run EViT blocks.) A model without a class token is refused: there is no
class attention to rank by.

Recorded per stage: `kept_index` [B, N_s] int64, the original position of every row leaving the stage (0 = class
token, p + j = patch token j in timm's order, -1 = a fused token, this stage's or a kept earlier one), and
`counts` [B, S] int64, the rows N_s leaving stage s (class, prefix and fused rows included). A drop_loc block whose
count keeps every token is still a stage (rows unchanged, no fused token).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from timm.models.vision_transformer import Attention, VisionTransformer

__all__ = ["EvitReference", "FUSED", "evit_keep_count", "evit_reference_forward"]

FUSED = -1  # kept_index of a fused token


class EvitReference(NamedTuple):
    """logits [B, classes]; per stage kept_index [B, N_s] int64 (original positions, FUSED for a fused token);
    counts [B, S] int64 (rows after each stage, class, prefix and fused tokens included)."""

    logits: torch.Tensor
    kept_index: tuple[torch.Tensor, ...]
    counts: torch.Tensor


def evit_keep_count(keep_rate: float, candidates: int) -> int:
    """Candidate tokens kept of `candidates` (N - 1 in EViT): math.ceil(keep_rate * candidates) in float64."""
    return math.ceil(keep_rate * candidates)


def _attention_with_probs(attn: Attention, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm Attention on h [B, N, C], unfused -> (output [B, N, C], softmax probabilities [B, H, N, N])."""
    B, N, _ = h.shape
    q, k, v = attn.qkv(h).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = ((q @ k.transpose(-2, -1)) * attn.scale).softmax(dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(B, N, -1)
    out = attn.norm(out)
    gate = getattr(attn, "gate", None)
    if gate is not None:
        out = out * gate(h).sigmoid()
    return attn.proj(out), probs


def _evit_stage(
    x: torch.Tensor, index: torch.Tensor, probs: torch.Tensor, p: int, keep_rate: float, fuse_token: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One stage on x [B, N, C] (after the attention residual), index [B, N], probs [B, H, N, N], p prefix rows
    -> (x [B, N', C], index [B, N']): prefix rows, the kept tokens by descending class attention, the fused one."""
    B, N, C = x.shape
    candidates = N - p
    left = evit_keep_count(keep_rate, candidates) if keep_rate < 1 else candidates
    if left >= candidates:
        return x, index
    if left < 1:
        raise ValueError(f"EViT keeps at least one token: keep_rate {keep_rate} of {candidates} tokens keeps {left}")
    cls_attn = probs[:, :, 0, p:].mean(dim=1)  # [B, N - p]
    top = torch.topk(cls_attn, left, dim=1, largest=True, sorted=True).indices  # [B, left]
    kept = torch.take_along_dim(x[:, p:], top[..., None], dim=1)
    rows = [x[:, :p], kept]
    new_index = [index[:, :p], torch.take_along_dim(index[:, p:], top, dim=1)]
    if fuse_token:
        dropped = torch.ones_like(cls_attn, dtype=torch.bool).scatter(1, top, False)  # [B, N - p]
        weight = torch.where(dropped, cls_attn, torch.zeros_like(cls_attn))
        rows.append(torch.einsum("bn,bnc->bc", weight, x[:, p:])[:, None])  # weighted sum, not an average
        new_index.append(torch.full((B, 1), FUSED, dtype=index.dtype, device=index.device))
    return torch.cat(rows, dim=1), torch.cat(new_index, dim=1)


@torch.no_grad()
def evit_reference_forward(
    vit: VisionTransformer,
    images: torch.Tensor,
    keep_rate: float,
    drop_loc: tuple[int, ...] = (3, 6, 9),
    *,
    fuse_token: bool = False,
) -> EvitReference:
    """EViT's inference forward of a timm VisionTransformer (eval mode) on images [B, 3, H, W].

    keep_rate in (0, 1] at every block of drop_loc (0-based, strictly increasing); fuse_token appends the weighted
    sum of the dropped tokens. Returns logits [B, classes], kept_index per stage [B, N_s], counts [B, S]."""
    if vit.cls_token is None:
        raise ValueError("EViT ranks tokens by the class token's attention: this model has no class token")
    if not 0 < keep_rate <= 1:
        raise ValueError(f"keep_rate must be in (0, 1], got {keep_rate}")
    if list(drop_loc) != sorted(set(drop_loc)) or any(not 0 <= i < len(vit.blocks) for i in drop_loc):
        raise ValueError(f"drop_loc must be strictly increasing block indices of 0..{len(vit.blocks) - 1}: {drop_loc}")
    p = vit.num_prefix_tokens
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))
    B, N, _ = x.shape
    index = torch.arange(N, device=x.device).expand(B, N)
    kept_index: list[torch.Tensor] = []
    for i, blk in enumerate(vit.blocks):
        attn_out, probs = _attention_with_probs(blk.attn, blk.norm1(x))
        x = x + blk.drop_path1(blk.ls1(attn_out))
        if i in drop_loc:
            x, index = _evit_stage(x, index, probs, p, keep_rate, fuse_token)
            kept_index.append(index)
        x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    logits = vit.forward_head(vit.norm(x))
    counts = torch.tensor([[k.shape[1] for k in kept_index]] * B, dtype=torch.int64).reshape(B, len(kept_index))
    return EvitReference(logits, tuple(kept_index), counts)
