"""Token merging (ToMe; Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023) on a timm
VisionTransformer, written from the published code as an independent test oracle.

Source: github.com/facebookresearch/ToMe, `tome/merge.py` (`bipartite_soft_matching`, `merge_wavg`) and
`tome/patch/timm.py` (`ToMeBlock`, `ToMeAttention`, `apply_patch`; `tome/utils.py::parse_r`). Read to learn the
semantics; no code copied, no raggedvit code used: padded [B, N, C] tensors, batched, and the timm model's own
modules.

Semantics, each with where it comes from:
- Where: in every merging block, after the attention residual and before the MLP (`ToMeBlock.forward`); an int r
  merges in every block (`parse_r`), `merge_at` restricts that to some blocks.
- Metric: the keys of that block's attention (on norm1(x)) averaged over the heads, `k.mean(1)`
  (`ToMeAttention.forward`), normalised by its L2 norm, similarity = dot products, float32
  (`bipartite_soft_matching`: `metric / metric.norm(dim=-1, keepdim=True)`, `a @ b.transpose`).
- Sets: A = rows 0, 2, 4, ..., B = rows 1, 3, 5, ... of the CURRENT rows, the protected ones included
  (`metric[..., ::2, :]`, `metric[..., 1::2, :]`).
- Protection: the class token (row 0, in A) gets score -inf for every B, the distillation token (row 1, in B) gets
  -inf from every A (`scores[..., 0, :] = -inf`, `scores[..., :, 0] = -inf`); `protected` counts them and
  `r = min(r, (t - protected) // 2)` with t the current rows; r <= 0 merges nothing.
- Matching: each A row's best B (`scores.max(dim=-1)`); the A rows sorted by that best score, descending
  (`argsort(descending=True)`); the first r merge (src), the rest stay (unm). Exact ties: torch.max's index and a
  stable sort (lower A row first); the published argsort is not stable.
- Merge: size-weighted average, `merge_wavg`: x * size and size are summed into their B row (B's own value
  included, `scatter_reduce(..., reduce="sum")`), then x = sum / size; sizes are carried to the next block.
- Output order: [unm, B] (`merge`: `torch.cat([unm, dst])`). With a class token the unm rows are sorted back to
  row order (`unm_idx.sort(dim=1)`, "to ensure the class token is at the start"); WITHOUT a class token they stay
  in descending-similarity order. B rows are in row order. A distillation token is moved to second place
  (`torch.cat([unm[:, :1], dst[:, :1], unm[:, 1:], dst[:, 1:]])`).
- Proportional attention: log(size) added to every key's logits, (q @ k^T) * scale + log(size), in every block
  (`ToMeAttention.forward`, `prop_attn=True` by default in `apply_patch`; the first block's sizes are 1).
- Head: the timm model's own `norm` and `forward_head` (`make_tome_class` calls the model's forward); a mean pool
  averages the merged rows unweighted.

Beyond the published code (timm of 2022: one class token, an optional distillation token, no registers, no
q/k norms): all num_prefix_tokens rows are protected (class, distillation AND registers; the published code would
merge registers like patches), the r cap counts them all, and they leave every merge first in their own order
(for class + distillation token this is exactly the published order). q_norm / k_norm / the attention norm and
gate are applied as timm applies them, and the metric uses the normalised keys. LayerScale (ls1 / ls2) is
applied by default; layer_scale=False drops it, as the published ToMeBlock (timm 0.4-era Block) does.

Recorded per merging block: `token_index` [B, N_s] int64 (the original token each row is named after: itself,
or for a B row that others merged into, the B token) and `size` [B, N_s] float32 (original tokens in each row).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from timm.models.vision_transformer import Attention, VisionTransformer

__all__ = ["TomeReference", "tome_merge_count", "tome_reference_forward"]


class TomeReference(NamedTuple):
    """logits [B, classes]; per merging block: token_index [B, N_s] int64 (the original token each row is named
    after: itself, or the B token others merged into) and size [B, N_s] float32 (original tokens in each row)."""

    logits: torch.Tensor
    token_index: tuple[torch.Tensor, ...]
    size: tuple[torch.Tensor, ...]


def tome_merge_count(rows: int, protected: int, r: int) -> int:
    """Rows a merging block removes of `rows` current rows: min(r, (rows - protected) // 2), at least 0."""
    return max(0, min(r, (rows - protected) // 2))


def _proportional_attention(attn: Attention, h: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm Attention on h [B, N, C] with log(size [B, N]) added per key -> (output [B, N, C], metric [B, N, D])."""
    B, N, _ = h.shape
    q, k, v = attn.qkv(h).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    logits = (q @ k.transpose(-2, -1)) * attn.scale + size.log()[:, None, None, :]
    out = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, -1)
    out = attn.norm(out)
    gate = getattr(attn, "gate", None)
    if gate is not None:
        out = out * gate(h).sigmoid()
    return attn.proj(out), k.mean(dim=1)


def _bipartite_merge(
    x: torch.Tensor,
    size: torch.Tensor,
    index: torch.Tensor,
    metric: torch.Tensor,
    protected: int,
    r: int,
    sort_unmerged: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One merge: x [B, t, C], size [B, t], index [B, t], metric [B, t, D] -> x, size, index with t - r' rows.

    Rows < protected never merge and come first; then the unmerged A rows (row order if sort_unmerged, else by
    descending best similarity), then the B rows (row order)."""
    B, t, C = x.shape
    r = tome_merge_count(t, protected, r)
    if r == 0:
        return x, size, index
    rows = torch.arange(t, device=x.device)
    a_rows, b_rows = rows[0::2], rows[1::2]
    unit = metric / metric.norm(dim=-1, keepdim=True)
    scores = unit[:, a_rows] @ unit[:, b_rows].transpose(1, 2)  # [B, |A|, |B|]
    scores[:, a_rows < protected, :] = -math.inf
    scores[:, :, b_rows < protected] = -math.inf
    best, dest = scores.max(dim=-1)  # [B, |A|]
    ranked = torch.sort(best, dim=1, descending=True, stable=True).indices
    src, unm = ranked[:, :r], ranked[:, r:]
    if sort_unmerged:
        unm = unm.sort(dim=1).values

    weighted = torch.cat((x * size[..., None], size[..., None]), dim=-1)  # [B, t, C + 1]: merge_wavg's sums
    a_part, b_part = weighted[:, a_rows], weighted[:, b_rows]
    moved = torch.take_along_dim(a_part, src[..., None], dim=1)  # [B, r, C + 1]
    b_sums = b_part  # a copy already (advanced indexing)
    b_sums.scatter_add_(1, torch.take_along_dim(dest, src, dim=1)[..., None].expand(-1, -1, C + 1), moved)
    kept_a = torch.take_along_dim(a_part, unm[..., None], dim=1)
    sums = torch.cat((kept_a, b_sums), dim=1)  # [B, t - r, C + 1]: published layout [unm, B]
    row_of = torch.cat((a_rows[unm], b_rows.expand(B, -1)), dim=1)  # current row each output row is named after
    new_index = torch.take_along_dim(index, row_of, dim=1)

    # prefix rows first in row order, the rest in the published layout order
    layout = torch.arange(t - r, device=x.device).expand(B, -1)
    key = torch.where(row_of < protected, row_of - protected, layout)
    perm = torch.sort(key, dim=1, stable=True).indices
    sums = torch.take_along_dim(sums, perm[..., None], dim=1)
    new_size = sums[..., C]
    return sums[..., :C] / new_size[..., None], new_size, torch.take_along_dim(new_index, perm, dim=1)


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
    sort_unmerged = vit.cls_token is not None
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))
    B, N, _ = x.shape
    size = torch.ones(B, N, device=x.device)
    index = torch.arange(N, device=x.device).expand(B, N)
    indices, sizes = [], []
    for i, blk in enumerate(vit.blocks):
        attn_out, metric = _proportional_attention(blk.attn, blk.norm1(x), size)
        x = x + blk.drop_path1(blk.ls1(attn_out) if layer_scale else attn_out)
        if i in blocks:
            x, size, index = _bipartite_merge(x, size, index, metric, p, r, sort_unmerged)
            indices.append(index)
            sizes.append(size)
        m = blk.mlp(blk.norm2(x))
        x = x + blk.drop_path2(blk.ls2(m) if layer_scale else m)
    logits = vit.forward_head(vit.norm(x))
    return TomeReference(logits, tuple(indices), tuple(sizes))
