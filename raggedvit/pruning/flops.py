"""FLOPs of a pruned forward, counted from the token counts per stage (DESIGN.md section 7).

One multiply-add is 2 FLOPs. Counted: the patch embedding (2 x patches x its weight's size), in every block each
nn.Linear on every row it runs on (2 x in x out per row) and attention's two matrix products (4 x n^2 x d for n rows
of attention width d = heads x head dim), and the head's nn.Linear layers once per image. Not counted: norms,
activations, softmax, the pruning stages' scores and selection, pooling, and a CaiT's class-attention tail (it reads
one query per image). A stage "at i" changes the row count of blocks i and after (Backbone.blocks); a merging stage
(tome) runs inside block i, after its attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from raggedvit.pruning.backbone import Backbone

__all__ = ["block_cost", "image_flops", "unpruned_flops"]


def block_cost(block: nn.Module) -> tuple[float, float, float]:
    """(a_attn, a_rest, b): FLOPs of `block` with its attention on n rows and the rest (the MLP) on m rows are
    a_attn x n + b x n^2 + a_rest x m. a_attn sums 2 x in x out over the nn.Linear layers of block.attn, a_rest over
    the block's other nn.Linear layers; b = 4 x the attention width (heads x head dim of block.attn, else a third of
    its qkv Linear's outputs)."""
    attn = getattr(block, "attn", None)
    in_attn = {id(m) for m in attn.modules()} if isinstance(attn, nn.Module) else set()
    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    a_attn = float(sum(2 * m.in_features * m.out_features for m in linears if id(m) in in_attn))
    a_rest = float(sum(2 * m.in_features * m.out_features for m in linears if id(m) not in in_attn))
    heads, head_dim = getattr(attn, "num_heads", None), getattr(attn, "head_dim", None)
    if heads is not None and head_dim is not None:
        width = int(heads) * int(head_dim)
    else:
        qkv = getattr(attn, "qkv", None)
        width = int(qkv.out_features) // 3 if isinstance(qkv, nn.Linear) else 0
    return a_attn, a_rest, 4.0 * width


def _fixed_flops(backbone: Backbone) -> float:
    """The patch embedding and the head: the part of a forward that pruning does not change."""
    model = backbone.model
    patches = int(model.patch_embed.num_patches)
    proj = getattr(model.patch_embed, "proj", None)
    embed = 2.0 * patches * proj.weight.numel() if isinstance(proj, (nn.Conv2d, nn.Linear)) else 0.0
    head = getattr(model, "head", None)
    head_flops = (
        sum(2.0 * m.in_features * m.out_features for m in head.modules() if isinstance(m, nn.Linear))
        if isinstance(head, nn.Module)
        else 0.0
    )
    return embed + head_flops


def image_flops(
    backbone: Backbone, prune_at: Sequence[int], token_counts: torch.Tensor, *, inside: bool = False
) -> torch.Tensor:
    """FLOPs [B] float64 of each image's forward: token_counts [B, stages] (rows per image after each stage,
    PrunedOutput.token_counts; stages = len(prune_at)) give every block its row count, the unpruned count
    (Backbone.tokens_per_image) before the first stage. A stage at i runs before block i; inside=True: inside block
    i, between its attention and its MLP (token merging), so block i's attention still runs on the rows before it."""
    counts = token_counts.detach().to("cpu", torch.float64)
    if counts.dim() != 2 or counts.shape[1] != len(prune_at):
        raise ValueError(f"token_counts: expected [B, {len(prune_at)}], got {list(counts.shape)}")
    n = torch.full((counts.shape[0],), float(backbone.tokens_per_image()), dtype=torch.float64)
    total = torch.full_like(n, _fixed_flops(backbone))
    stage = 0
    for i, block in enumerate(backbone.blocks):
        before = n
        while stage < len(prune_at) and prune_at[stage] <= i:
            n = counts[:, stage]
            stage += 1
        a_attn, a_rest, b = block_cost(block)
        attn_rows = before if inside else n
        total += a_attn * attn_rows + b * attn_rows * attn_rows + a_rest * n
    return total


def unpruned_flops(backbone: Backbone) -> float:
    """FLOPs of one image's unpruned forward."""
    return float(image_flops(backbone, (), torch.zeros(1, 0))[0])
