"""Rotary position embedding of packed rows: each kept row rotates by its ORIGINAL token's angles.

A timm rope table holds one row per patch of the image grid (raster order), sin and cos concatenated:
[Np, 2D] (axial / DINOv3 rope: the same angles for every head) or [H, Np, 2D] (one block of mixed rope: angles per
head). timm rotates the patch rows of q and k (tokens p.. of each image) by those rows and leaves the p prefix rows
(class, register tokens) as they are. On packed rows the row of a token is its original index
(`PackedState.token_index`), never its packed row number: a pruned image's rows keep their positions.

`extend_rope_table` prepends an identity row (sin 0, cos 1), so that one gather serves every row: patch row t reads
table row token_index[t] - p + 1, prefix rows and evit fused rows (token_index -1) read row 0 and stay unrotated
(x * 1 + rot(x) * 0 = x exactly). The rotation itself is timm's `apply_rot_embed_cat` (plain torch ops: they trace
to ONNX Mul / Add / Slice / Concat).
"""

from __future__ import annotations

import torch
from timm.layers import apply_rot_embed_cat

__all__ = ["apply_packed_rope", "extend_rope_table", "rope_rows"]


def extend_rope_table(table: torch.Tensor) -> torch.Tensor:
    """table [..., Np, 2D] (sin | cos) -> [..., Np + 1, 2D] with row 0 the identity rotation (sin 0, cos 1)."""
    half = table.shape[-1] // 2
    identity = torch.cat((table.new_zeros(half), table.new_ones(half))).expand(*table.shape[:-2], 1, 2 * half)
    return torch.cat((identity, table), dim=-2)


def rope_rows(table: torch.Tensor, token_index: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Each packed row's sin | cos: a gather of an extended table.

    Args:
        table: [Np + 1, 2D] or [H, Np + 1, 2D], from `extend_rope_table`.
        token_index: [T] int64 original token index of each packed row (prefix 0..p-1, patches p.., -1 fused).
        num_prefix: p, the leading tokens timm leaves unrotated.

    Returns:
        [T, 1, 2D] (one row for every head) or [T, H, 2D], in the table's dtype.
    """
    slot = torch.where(token_index >= num_prefix, token_index - (num_prefix - 1), 0)
    rows = table.index_select(-2, slot)  # [T, 2D] or [H, T, 2D]
    return rows.unsqueeze(1) if rows.dim() == 2 else rows.transpose(0, 1)


def apply_packed_rope(x: torch.Tensor, rows: torch.Tensor, *, half: bool) -> torch.Tensor:
    """Rotate packed q or k: x [T, H, D], rows [T, 1 or H, 2D] from `rope_rows` -> [T, H, D] in x's dtype.

    half: timm's `rotate_half` layout (DINOv3, PE), else the interleaved one. The product runs in the promoted
    dtype (a float32 table keeps float32 angles for float16 q/k), as timm's."""
    return apply_rot_embed_cat(x, rows, half=half)
