"""What ranks the tokens of a pruning stage: one module per stage, owned by PrunedViT (`PrunedViT.scorers`).

Every scorer maps the rows a stage sees to one float32 score per row (higher: kept first):

    scorer(x [T, C], cls_attn [T] float32 | None, n, num_prefix) -> scores [T] float32

x is the residual stream where the stage runs; cls_attn the class token's attention (head mean) of the block the
policy reads (None where it needs none); n the rows per image (every image has n rows when a scorer needs it:
the stages of such policies keep counts known before the data); num_prefix p, the rows no stage prunes (their
scores are never read). The parameter-free ones are topk-l2's squared L2 norm and the class-attention policies'
cls_attn; DynamicViT's learned predictor plugs in at the same place, so export, `apply_dtype` and the FLOP count
see it as any submodule. `scorer_for` builds a policy's scorer from its descriptor (raggedvit.policies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raggedvit.policies import Policy

__all__ = ["ClsAttentionScorer", "DynamicVitPredictor", "KeySimilarity", "L2Scorer", "scorer_for"]


class L2Scorer(nn.Module):
    """topk-l2: the squared L2 norm of each row (the norm's order, no square root), in float32."""

    def forward(self, x: torch.Tensor, cls_attn: torch.Tensor | None, n: int | None, num_prefix: int) -> torch.Tensor:
        xf = x.float()
        return (xf * xf).sum(dim=-1)


class ClsAttentionScorer(nn.Module):
    """evit, cls-mass: the class token's attention to each row, mean over heads (computed by the attention op)."""

    def forward(self, x: torch.Tensor, cls_attn: torch.Tensor | None, n: int | None, num_prefix: int) -> torch.Tensor:
        if cls_attn is None:
            raise ValueError("a class-attention stage needs the block's cls_attn")
        return cls_attn


class KeySimilarity(nn.Module):
    """tome: its stages are ranked by the merging block's keys (packed_attend's metric), inside the merge itself
    (raggedvit/pruning/merge.py); this scorer holds the stage's place in `PrunedViT.scorers` and is never called."""

    def forward(self, x: torch.Tensor, cls_attn: torch.Tensor | None, n: int | None, num_prefix: int) -> torch.Tensor:
        raise RuntimeError("tome stages rank by key similarity inside the merge, not by a scorer")


class DynamicVitPredictor(nn.Module):
    """DynamicViT's score predictor (Rao et al., NeurIPS 2021: `PredictorLG`) on a uniform packed state.

    in_conv = LayerNorm(C), Linear(C, C), GELU on each patch row; the first C/2 channels stay per token, the last
    C/2 are averaged over the image's current patch rows (prefix rows excluded); out_conv = Linear(C, C/2), GELU,
    Linear(C/2, C/4), GELU, Linear(C/4, 2), LogSoftmax, and DynamicViT keeps the rows with the highest log p(keep)
    (channel 0). Submodule names follow DynamicViT's checkpoints (`in_conv.0`, `in_conv.1`, `out_conv.0`,
    `out_conv.2`, `out_conv.4`), so a stage's state dict loads as saved.

    The forward computes the same ranking in fewer graph nodes (each a kernel in a CUDA graph): log p(keep) =
    -softplus(z_drop - z_keep) increases strictly with z_keep - z_drop, so the score is that difference without the
    constant last bias (one output row, the last Linear's two rows subtracted; no LogSoftmax); the first out_conv
    Linear on [local, mean of global] is the sum of two Linears whose weights have the other half zeroed, the second
    on the mean over the patch rows, so neither half nor the broadcast mean is materialised. The folded weights are
    buffers derived from the parameters whenever a state dict is loaded (`refold`). Prefix rows get scores too (never
    read)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f"DynamicViT's predictor needs a width divisible by 4, got {dim}")
        self.in_conv = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.out_conv = nn.Sequential(
            nn.Linear(dim, dim // 2),
            nn.GELU(),
            nn.Linear(dim // 2, dim // 4),
            nn.GELU(),
            nn.Linear(dim // 4, 2),
            nn.LogSoftmax(dim=-1),
        )
        for name in ("w_local", "w_global", "w_keep"):
            self.register_buffer(name, torch.empty(0), persistent=False)
        self.refold()
        self.register_load_state_dict_post_hook(lambda module, keys: module.refold())

    @torch.no_grad()
    def refold(self) -> None:
        """Derive the folded weights from the parameters: w_local / w_global [C/2, C] (out_conv.0's weight with the
        global / local half of its input columns zeroed), w_keep [1, C/4] (out_conv.4's keep row minus its drop
        row)."""
        w = self.out_conv[0].weight
        local = (torch.arange(w.shape[1], device=w.device) < w.shape[1] // 2).to(w.dtype)
        self.w_local, self.w_global = w * local, w * (1 - local)
        last = self.out_conv[4].weight
        self.w_keep = (last[0] - last[1]).unsqueeze(0)

    def forward(self, x: torch.Tensor, cls_attn: torch.Tensor | None, n: int | None, num_prefix: int) -> torch.Tensor:
        """x [B*n, C] (n rows per image, the first p the prefix) -> scores [B*n] float32 (z_keep - z_drop up to a
        constant)."""
        if n is None:
            raise ValueError("DynamicViT's predictor runs on a uniform state (every image with the same rows)")
        T, C = x.shape
        h = self.in_conv(x.reshape(T // n, n, C).to(self.w_local.dtype))  # [B, n, C]
        glob = h[:, num_prefix:].mean(dim=1, keepdim=True)  # [B, 1, C] the mean over the patch rows
        y = F.linear(h, self.w_local, self.out_conv[0].bias) + F.linear(glob, self.w_global)  # [B, n, C/2]
        a = self.out_conv[3](self.out_conv[2](self.out_conv[1](y)))  # [B, n, C/4]
        return F.linear(a, self.w_keep).reshape(T).float()


def scorer_for(policy: Policy, dim: int) -> nn.Module:
    """A new scorer for one stage of `policy` on a model of width `dim` (a learned one starts untrained: its weights
    come with the checkpoint, `raggedvit.pruning.factory`)."""
    if policy.scorer == "l2":
        return L2Scorer()
    if policy.scorer == "cls":
        return ClsAttentionScorer()
    if policy.scorer == "similarity":
        return KeySimilarity()
    if policy.scorer == "predictor":
        return DynamicVitPredictor(dim)
    raise ValueError(f"policy {policy.name!r} has no stages to score")
