"""Token merging (ToMe) on a timm VisionTransformer, written from the paper, as an independent test oracle.

Bolya et al., "Token Merging: Your ViT But Faster" (ICLR 2023), section 3 and its timm patch's structure: in every
merging block, between the attention and the MLP, the tokens are split into two alternating sets A and B, each A
token draws an edge to its most similar B token (cosine similarity of the keys averaged over the heads), the r most
similar edges are merged by a size-weighted average, and the sets are concatenated again (unmerged A tokens, then
B). Proportional attention adds log(size) to every key's attention logits. The class token (and the distillation
token and registers) never merge: here they are left out of both sets, which for a class token (position 0, set A)
and a distillation token (position 1, set B) is what the ToMe code's -inf rows / columns do.

No raggedvit code: padded [B, N, C] tensors, timm's own modules (embedding, Attention with an additive mask, norms,
MLP, LayerScale, head), one image at a time for the merge. Ties (exact equal similarities) go to the lower index.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

__all__ = ["TomeReference", "tome_reference_forward"]


class TomeReference(NamedTuple):
    """logits [B, classes]; per merging block: token_index [B, N_s] int64 (the original token each row is named
    after: itself, or the B token others merged into) and size [B, N_s] float32 (original tokens in each row)."""

    logits: torch.Tensor
    token_index: tuple[torch.Tensor, ...]
    size: tuple[torch.Tensor, ...]


def _merge_image(
    x: torch.Tensor, size: torch.Tensor, index: torch.Tensor, metric: torch.Tensor, num_prefix: int, r: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image: x [N, C], size [N], index [N], metric [N, D] -> the merged x, size, index (N - r' rows)."""
    N = x.shape[0]
    set_a = [t for t in range(num_prefix, N) if t % 2 == 0]
    set_b = [t for t in range(num_prefix, N) if t % 2 == 1]
    r = min(r, (N - num_prefix) // 2)
    unit = F.normalize(metric.double(), dim=-1, eps=1e-12).float()
    sim = unit[set_a] @ unit[set_b].T  # [|A|, |B|]
    best, dest = sim.max(dim=1)
    ranked = sorted(range(len(set_a)), key=lambda i: (-float(best[i]), i))
    merged = ranked[:r]
    total = x[set_b].double() * size[set_b, None].double()
    count = size[set_b].double().clone()
    for i in merged:
        j = int(dest[i])
        total[j] += x[set_a[i]].double() * float(size[set_a[i]])
        count[j] += float(size[set_a[i]])
    stay = [set_a[i] for i in range(len(set_a)) if i not in set(merged)]
    new_x = torch.cat((x[:num_prefix], x[stay], (total / count[:, None]).to(x.dtype)))
    new_size = torch.cat((size[:num_prefix], size[stay], count.float()))
    new_index = torch.cat((index[:num_prefix], index[stay], index[set_b]))
    return new_x, new_size, new_index


@torch.no_grad()
def tome_reference_forward(
    vit: VisionTransformer, images: torch.Tensor, r: int, merge_at: tuple[int, ...] | None = None,
    *, layer_scale: bool = True,
) -> TomeReference:  # fmt: skip
    """ToMe's forward of a timm VisionTransformer (eval mode) on images [B, 3, S, S].

    merge_at: the blocks that merge (None: every block, as ToMe). layer_scale=False drops LayerScale as ToMe's own
    timm patch does (its block adds the attention and MLP outputs without ls1 / ls2)."""
    blocks = range(len(vit.blocks)) if merge_at is None else merge_at
    p = vit.num_prefix_tokens
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))
    B, N, _ = x.shape
    size = torch.ones(B, N, device=x.device)
    index = torch.arange(N, device=x.device).repeat(B, 1)
    indices, sizes = [], []
    for i, blk in enumerate(vit.blocks):
        attn = blk.attn
        h = blk.norm1(x)
        a = attn(h, attn_mask=size.log()[:, None, None, :])  # proportional attention: + log(size) per key
        x = x + blk.drop_path1(blk.ls1(a) if layer_scale else a)
        if i in blocks:
            n = x.shape[1]
            k = attn.qkv(h).reshape(B, n, 3, attn.num_heads, attn.head_dim)[:, :, 1].transpose(1, 2)
            metric = attn.k_norm(k).mean(dim=1)  # [B, n, D]
            rows = [_merge_image(x[b], size[b], index[b], metric[b], p, r) for b in range(B)]
            x, size, index = (torch.stack(t) for t in zip(*rows))
            indices.append(index)
            sizes.append(size)
        m = blk.mlp(blk.norm2(x))
        x = x + blk.drop_path2(blk.ls2(m) if layer_scale else m)
    logits = vit.forward_head(vit.norm(x))
    return TomeReference(logits, tuple(indices), tuple(sizes))
