"""Public ragged attention op: attention within each packed variable-length sequence (DESIGN.md section 1)."""

from __future__ import annotations

import math

import torch

from raggedvit.kernels._cpu import ragged_attention_cpu
from raggedvit.kernels._launch import _launch_triton
from raggedvit.kernels._op import ragged_attention_op
from raggedvit.kernels.reference import pos_table_size

__all__ = ["ragged_attention"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CU_DTYPES = (torch.int32, torch.int64)
_MAX_TRITON_D = 256


def _check(qkv: torch.Tensor, cu_seqlens: torch.Tensor, num_heads: int, bias: torch.Tensor | None) -> int:
    """Validate shapes, dtypes and devices (never reads tensor data); returns the head dim D."""
    if qkv.dim() != 2:
        raise ValueError(f"qkv must be 2-D [T, 3*H*D], got shape {tuple(qkv.shape)}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    width = qkv.shape[1]
    if width % (3 * num_heads) != 0 or width == 0:
        raise ValueError(
            f"qkv width {width} (shape {tuple(qkv.shape)}) is not a positive multiple of 3*num_heads = {3 * num_heads}"
        )
    if qkv.dtype not in _DTYPES:
        raise ValueError(f"qkv dtype must be float16, bfloat16 or float32, got {qkv.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D [B+1] with B >= 0, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in _CU_DTYPES:
        raise ValueError(f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.device != qkv.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but qkv is on {qkv.device}")
    if bias is not None and (bias.shape != (width,) or bias.dtype != qkv.dtype or bias.device != qkv.device):
        raise ValueError(
            f"bias must be [{width}] {qkv.dtype} on {qkv.device} (qkv shape {tuple(qkv.shape)}), "
            f"got {tuple(bias.shape)} {bias.dtype} on {bias.device}"
        )
    D = width // (3 * num_heads)
    if qkv.is_cuda and D > _MAX_TRITON_D:
        raise ValueError(f"head dim D={D} (qkv shape {tuple(qkv.shape)}, H={num_heads}) exceeds 256 (Triton path)")
    return D


def _check_pos(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    pos_table: torch.Tensor | None,
    token_pos: torch.Tensor | None,
    grid: tuple[int, int] | None,
    num_prefix: int,
) -> tuple[int, int]:
    """Validate the relative position inputs (never reads tensor data); (grid_h, grid_w), or (0, 0) if absent."""
    if pos_table is None and token_pos is None:
        return (0, 0)
    if pos_table is None or token_pos is None or grid is None:
        raise ValueError("pos_table, token_pos and grid go together: pass all three or none")
    gh, gw = (int(g) for g in grid)
    if gh < 1 or gw < 1 or num_prefix < 0:
        raise ValueError(
            f"grid must be two ints >= 1 and num_prefix >= 0, got grid={tuple(grid)}, num_prefix={num_prefix}"
        )
    R = pos_table_size((gh, gw))
    if pos_table.shape != (num_heads, R) or pos_table.dtype != torch.float32 or pos_table.device != qkv.device:
        raise ValueError(
            f"pos_table must be [num_heads, (2*grid_h-1)*(2*grid_w-1)+3] = [{num_heads}, {R}] float32 on {qkv.device} "
            f"(grid {gh}x{gw}), got {tuple(pos_table.shape)} {pos_table.dtype} on {pos_table.device}"
        )
    T = qkv.shape[0]
    if token_pos.shape != (T,) or token_pos.dtype != cu_seqlens.dtype or token_pos.device != qkv.device:
        raise ValueError(
            f"token_pos must be [{T}] {cu_seqlens.dtype} (cu_seqlens's dtype) on {qkv.device} (qkv shape "
            f"{tuple(qkv.shape)}), got {tuple(token_pos.shape)} {token_pos.dtype} on {token_pos.device}"
        )
    if num_prefix + gh * gw >= 2**31 or num_heads * R >= 2**31:
        raise ValueError(f"grid {gh}x{gw} with num_prefix={num_prefix} and {num_heads} heads exceeds int32 indexing")
    return gh, gw


def _check_key_bias(qkv: torch.Tensor, key_bias: torch.Tensor | None) -> None:
    """key_bias must be [T] float32 on qkv's device (never reads tensor data)."""
    if key_bias is None:
        return
    T = qkv.shape[0]
    if key_bias.shape != (T,) or key_bias.dtype != torch.float32 or key_bias.device != qkv.device:
        raise ValueError(
            f"key_bias must be [{T}] float32 on {qkv.device} (one entry per qkv row, qkv shape {tuple(qkv.shape)}), "
            f"got {tuple(key_bias.shape)} {key_bias.dtype} on {key_bias.device}"
        )


def ragged_attention(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    *,
    scale: float | None = None,
    max_seqlen: int | None = None,
    return_cls_attn: bool = False,
    bias: torch.Tensor | None = None,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid: tuple[int, int] | None = None,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Bidirectional attention within each packed sequence (inference only, no autograd).

    Args:
        qkv: [T, 3*H*D] float16/bfloat16/float32, timm's qkv Linear output (q | k | v, head-major).
        cu_seqlens: [B+1] int32/int64 on qkv's device, 0 = cu[0] <= ... <= cu[B] <= T. Rows >= cu[B] are
            dead (the capacity layout): their out and cls_attn are zero. Never read on the host for CUDA tensors
            (checked on CPU).
        num_heads: H.
        scale: softmax scale, default 1/sqrt(D).
        max_seqlen: optional hint (unused: the kernel grid depends on T and H only).
        return_cls_attn: also return cls_attn.
        bias: optional [3*H*D] in qkv's dtype, the qkv Linear's bias: the result is attention of qkv + bias
            (the kernels add it on load; the exported graph passes it to RaggedAttention instead of an Add).
        pos_table: optional [H, R] float32 relative position bias table, R = (2*grid_h-1)*(2*grid_w-1) + 3
            (BEiT's layout, transposed: offsets in raster order, then class->patch, patch->class, class->class).
        token_pos: [T] cu_seqlens's dtype, each row's ORIGINAL token index in its image (prefix tokens 0..p-1,
            then patches in raster order; -1 or any other value outside [p, p + grid_h*grid_w): a class row).
            The logit of a (query, key) pair gets pos_table[h, relative_position_index(...)] (reference.py).
        grid: (grid_h, grid_w) patch grid, with pos_table.
        num_prefix: p, prefix tokens before the patches in token_pos's numbering.
        key_bias: optional [T] float32, added to the logit of every (query, key) pair in every head by its key:
            logit(q, k) = scale * q.k (+ pos) + key_bias[k] (cls_attn included). ToMe's proportional attention
            passes log(size) of each merged token.

    Returns:
        out [T, H*D] in qkv.dtype, or (out, cls_attn [T] float32) where cls_attn[t] is the mean over
        heads of the attention the first token of t's sequence pays to t.

    Eager CUDA tensors launch the Triton kernels directly (lean path); CPU tensors run a padded SDPA;
    under torch.compile / torch.export (or with fake/functional tensors) the call goes through
    `torch.ops.raggedvit.ragged_attention`.
    """
    D = _check(qkv, cu_seqlens, num_heads, bias)
    gh, gw = _check_pos(qkv, cu_seqlens, num_heads, pos_table, token_pos, grid, num_prefix)
    _check_key_bias(qkv, key_bias)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    scale = float(scale)
    tensors = (qkv, cu_seqlens) if token_pos is None else (qkv, cu_seqlens, pos_table, token_pos)
    if key_bias is not None:
        tensors = (*tensors, key_bias)
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors):
        extra = () if key_bias is None else (key_bias,)  # older graphs (no key bias) keep the 11-argument call
        out, cls_attn = ragged_attention_op(
            qkv, cu_seqlens, bias, num_heads, scale, return_cls_attn, pos_table, token_pos, gh, gw, num_prefix, *extra
        )
        return (out, cls_attn) if return_cls_attn else out
    pos = {} if key_bias is None else {"key_bias": key_bias.contiguous()}
    if pos_table is not None:
        pos.update(pos_table=pos_table.contiguous(), token_pos=token_pos.contiguous(), grid=(gh, gw),
                   num_prefix=num_prefix)  # fmt: skip
    if qkv.is_cuda:
        if not qkv.is_contiguous():
            qkv = qkv.contiguous()
        if not cu_seqlens.is_contiguous():
            cu_seqlens = cu_seqlens.contiguous()
        if qkv.get_device() == torch.cuda.current_device():
            out, cls_attn = _launch_triton(qkv, cu_seqlens, num_heads, scale, return_cls_attn, bias=bias, **pos)
        else:
            with torch.cuda.device(qkv.device):
                out, cls_attn = _launch_triton(qkv, cu_seqlens, num_heads, scale, return_cls_attn, bias=bias, **pos)
    else:
        out, cls_attn = ragged_attention_cpu(
            qkv.contiguous(), cu_seqlens, num_heads, scale, return_cls_attn, bias=bias, **pos
        )
    return (out, cls_attn) if return_cls_attn else out
