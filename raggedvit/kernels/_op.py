"""`torch.ops.raggedvit.ragged_attention`: the custom op seen by torch.compile / torch.export.

Schema: (qkv [T, 3*H*D], cu_seqlens [B+1], bias [3*H*D] or None (the qkv Linear's bias: attention of qkv + bias),
         num_heads, scale, return_cls_attn,
         pos_table [H, R] fp32 or None, token_pos [T] cu's dtype or None, grid_h, grid_w, num_prefix
         (relative position bias, DESIGN.md section 1; the last five default to "none", so older calls still bind),
         key_bias [T] fp32 or None (added to every score of its key: ToMe's proportional attention, log(size)))
        -> (out [T, H*D] qkv.dtype, cls_attn [T] fp32, or [0] when not requested).
The fake implementation reads shapes only (T may be unbacked, e.g. from nonzero under export).
"""

from __future__ import annotations

import torch

from raggedvit.kernels._cpu import ragged_attention_cpu
from raggedvit.kernels._launch import _launch_triton

__all__ = ["ragged_attention_op"]


def _pos(pos_table, token_pos, grid_h: int, grid_w: int, num_prefix: int, key_bias) -> dict:
    """The kernels' relative position and key bias keyword arguments ({} without either)."""
    extra = {} if key_bias is None else {"key_bias": key_bias.contiguous()}
    if pos_table is None:
        return extra
    return {"pos_table": pos_table.contiguous(), "token_pos": token_pos.contiguous(), "grid": (grid_h, grid_w),
            "num_prefix": num_prefix, **extra}  # fmt: skip


@torch.library.custom_op("raggedvit::ragged_attention", mutates_args=())
def ragged_attention_op(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError(f"raggedvit::ragged_attention has no kernel for device {qkv.device}")


@ragged_attention_op.register_kernel("cpu")
def _cpu_kernel(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return ragged_attention_cpu(
        qkv.contiguous(),
        cu_seqlens,
        num_heads,
        scale,
        return_cls_attn,
        bias=bias,
        **_pos(pos_table, token_pos, grid_h, grid_w, num_prefix, key_bias),
    )


@ragged_attention_op.register_kernel("cuda")
def _cuda_kernel(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.cuda.device(qkv.device):
        out, cls_attn = _launch_triton(
            qkv.contiguous(),
            cu_seqlens.contiguous(),
            num_heads,
            scale,
            return_cls_attn,
            bias=None if bias is None else bias.contiguous(),
            **_pos(pos_table, token_pos, grid_h, grid_w, num_prefix, key_bias),
        )
    return out, cls_attn


@ragged_attention_op.register_fake
def _fake(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid_h: int = 0,
    grid_w: int = 0,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    T = qkv.shape[0]
    width = qkv.shape[1]
    out = qkv.new_empty((T, width // 3))
    cls_attn = qkv.new_empty((T if return_cls_attn else 0,), dtype=torch.float32)
    return out, cls_attn
