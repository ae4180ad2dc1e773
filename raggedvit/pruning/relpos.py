"""Relative position bias tables of timm's modules in the layout of the ragged attention op (DESIGN.md section 1).

The op reads pos_table [H, R] float32, R = (2*gh-1)*(2*gw-1) + 3: entry (dy + gh-1)*(2*gw-1) + (dx + gw-1) is the
bias of a (query, key) patch pair with (dy, dx) = query position - key position; the last three entries are
class->patch, patch->class and class->class (BEiT's layout; `raggedvit.kernels.reference.relative_position_index`
is the index). Every table here is input-independent: a backbone builds it once per block and forward.

- BEiT (`timm.models.beit.Attention`, `RelativePositionBias`): relative_position_bias_table [R, H], transposed; a
  block with its own table and a shared one adds the two (timm adds the two dense biases).
- `timm.layers.RelPosBias`: its table, with 3 zero class entries appended when it has no prefix token (timm's
  index then never reads them).
- `timm.layers.RelPosMlp`: its MLP over the (2gh-1)(2gw-1) log coordinates (then 16*sigmoid in 'swin' mode), with
  3 zero class entries: timm pads the prefix rows and columns of its dense bias with zeros.
"""

from __future__ import annotations

import torch
from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp
from timm.models.beit import Attention as BeitAttention
from timm.models.beit import RelativePositionBias
from torch import nn

from raggedvit.kernels.reference import pos_table_size, relative_position_index
from raggedvit.pruning.backbone import module_dtype

__all__ = ["beit_table", "dense_bias", "relpos_table"]


def _grid(window_size) -> tuple[int, int]:
    return int(window_size[0]), int(window_size[1])


def _transposed(table: torch.Tensor, grid: tuple[int, int], owner: str) -> torch.Tensor:
    """[R', H] (R' = R or R - 3) -> [H, R] float32, zero class entries appended when R' = R - 3."""
    R = pos_table_size(grid)
    if table.dim() != 2 or table.shape[0] not in (R, R - 3):
        raise ValueError(
            f"{owner}: relative position table of shape {tuple(table.shape)} does not fit grid {grid[0]}x{grid[1]} "
            f"(expected [{R}, heads] or [{R - 3}, heads])"
        )
    out = table.t().to(torch.float32)
    if table.shape[0] == R - 3:
        out = torch.cat((out, out.new_zeros(out.shape[0], 3)), dim=1)
    return out


def beit_table(attn: BeitAttention, shared: RelativePositionBias | None, grid: tuple[int, int]) -> torch.Tensor | None:
    """pos_table [H, R] float32 of one BEiT block (its own table plus the model's shared one), None without either."""
    tables = []
    for owner, module in (("block", attn), ("shared", shared)):
        table = getattr(module, "relative_position_bias_table", None) if module is not None else None
        if table is None:
            continue
        if _grid(module.window_size) != grid:
            raise ValueError(f"{owner} relative position window {tuple(module.window_size)} != patch grid {grid}")
        tables.append(_transposed(table, grid, f"{owner} relative_position_bias_table"))
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else tables[0] + tables[1]


def relpos_table(rel_pos: nn.Module, grid: tuple[int, int]) -> torch.Tensor:
    """pos_table [H, R] float32 of a timm RelPosBias or RelPosMlp (its prefix rows/columns: zero class entries)."""
    if _grid(rel_pos.window_size) != grid:
        raise ValueError(f"relative position window {tuple(rel_pos.window_size)} != patch grid {grid}")
    if type(rel_pos) is RelPosBias:
        return _transposed(rel_pos.relative_position_bias_table, grid, "RelPosBias")
    if type(rel_pos) is RelPosMlp:
        coords = rel_pos.rel_coords_log  # [2gh-1, 2gw-1, 2]
        table = rel_pos.mlp(coords.to(module_dtype(rel_pos.mlp, coords.dtype))).reshape(-1, rel_pos.num_heads)
        table = rel_pos.bias_act(table)  # elementwise: timm applies it after its gather, the same values
        if rel_pos.bias_gain is not None:
            table = rel_pos.bias_gain * table
        return _transposed(table, grid, "RelPosMlp")
    raise ValueError(f"relative position module {type(rel_pos).__name__} is not supported; expected RelPosBias/Mlp")


def dense_bias(table: torch.Tensor, token_index: torch.Tensor, grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
    """The dense bias the op applies: table [H, R], token_index [N] (original token indices) -> [H, N, N]."""
    return table[:, relative_position_index(token_index, token_index, grid, num_prefix)]
