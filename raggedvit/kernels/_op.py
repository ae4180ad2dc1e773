"""`torch.ops.raggedvit.ragged_attention`: the custom op seen by torch.compile / torch.export.

Schema: (qkv [T, 3*H*D], cu_seqlens [B+1], bias [3*H*D] or None (the qkv Linear's bias: attention of qkv + bias),
         num_heads, scale, return_cls_attn)
        -> (out [T, H*D] qkv.dtype, cls_attn [T] fp32, or [0] when not requested).
The fake implementation reads shapes only (T may be unbacked, e.g. from nonzero under export).
"""

from __future__ import annotations

import torch

from raggedvit.kernels._cpu import ragged_attention_cpu
from raggedvit.kernels._launch import _launch_triton

__all__ = ["ragged_attention_op"]


@torch.library.custom_op("raggedvit::ragged_attention", mutates_args=())
def ragged_attention_op(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
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
) -> tuple[torch.Tensor, torch.Tensor]:
    return ragged_attention_cpu(qkv.contiguous(), cu_seqlens, num_heads, scale, return_cls_attn, bias=bias)


@ragged_attention_op.register_kernel("cuda")
def _cuda_kernel(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.cuda.device(qkv.device):
        out, cls_attn = _launch_triton(
            qkv.contiguous(),
            cu_seqlens.contiguous(),
            num_heads,
            scale,
            return_cls_attn,
            bias=None if bias is None else bias.contiguous(),
        )
    # custom ops must not return an output aliasing another call's output: the cached empty cls_attn is copied
    return out, cls_attn if return_cls_attn else cls_attn.new_empty(0)


@ragged_attention_op.register_fake
def _fake(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    T = qkv.shape[0]
    width = qkv.shape[1]
    out = qkv.new_empty((T, width // 3))
    cls_attn = qkv.new_empty((T if return_cls_attn else 0,), dtype=torch.float32)
    return out, cls_attn
