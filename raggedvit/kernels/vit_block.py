"""Public block op: one whole pre-norm ViT block (timm's `Block` with `Attention` and `Mlp`) on packed rows.

    y = x1 + ls2 * fc2(GELU(fc1(LN2(x1)))),  x1 = x + ls1 * proj(ragged_attention(qkv(LN1(x))))

on the live rows [0, cu[B]); the dead rows of the capacity layout are zero. The semantics are
`raggedvit.kernels.reference.vit_block_reference`; the op is `torch.ops.raggedvit.vit_block` (_block_op.py).
"""

from __future__ import annotations

import math

import torch

from raggedvit.kernels._block_op import vit_block_cuda, vit_block_op
from raggedvit.kernels.reference import BlockWeights, vit_block_reference

__all__ = ["check_block_args", "vit_block"]

_STREAM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CU_DTYPES = (torch.int32, torch.int64)


def check_block_args(x: torch.Tensor, cu_seqlens: torch.Tensor, w: BlockWeights, num_heads: int) -> None:
    """ValueError (one line, naming the argument and the shapes) unless the arguments make one block: x [T, C],
    cu_seqlens [B+1] int32/int64, every weight of BlockWeights in its shape, norms and LayerScales in x's dtype, the
    Linear weights and biases in one GEMM dtype, C a multiple of num_heads, everything on x's device. Reads no data."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, C], got shape {tuple(x.shape)}")
    if x.dtype not in _STREAM_DTYPES:
        raise ValueError(f"x dtype must be float16, bfloat16 or float32, got {x.dtype}")
    T, C = x.shape
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D [B+1] with B >= 0, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in _CU_DTYPES:
        raise ValueError(f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
    if num_heads <= 0 or C % num_heads:
        raise ValueError(f"num_heads must divide C = {C} (x shape {tuple(x.shape)}), got {num_heads}")
    F = w.fc1_weight.shape[0] if w.fc1_weight.dim() == 2 else -1
    gemm = w.qkv_weight.dtype
    if gemm not in _STREAM_DTYPES:
        raise ValueError(f"qkv_weight dtype must be float16, bfloat16 or float32, got {gemm}")
    shapes = {
        "norm1_weight": (C,), "norm1_bias": (C,), "qkv_weight": (3 * C, C), "qkv_bias": (3 * C,),
        "proj_weight": (C, C), "proj_bias": (C,), "norm2_weight": (C,), "norm2_bias": (C,),
        "fc1_weight": (F, C), "fc1_bias": (F,), "fc2_weight": (C, F), "fc2_bias": (C,), "ls1": (C,), "ls2": (C,),
    }  # fmt: skip
    stream = {"norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias", "ls1", "ls2"}
    for name, shape in shapes.items():
        t = getattr(w, name)
        if t is None:
            if name in ("norm1_weight", "norm1_bias", "qkv_weight", "proj_weight", "norm2_weight", "norm2_bias",
                        "fc1_weight", "fc2_weight"):  # fmt: skip
                raise ValueError(f"{name} is required (x shape {tuple(x.shape)})")
            continue
        if F <= 0 and name == "fc1_weight":
            raise ValueError(f"fc1_weight must be 2-D [F, C={C}] with F >= 1, got shape {tuple(t.shape)}")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} must be {list(shape)} (x shape {tuple(x.shape)}, fc1_weight shape "
                f"{tuple(w.fc1_weight.shape)}), got shape {tuple(t.shape)}"
            )
        want = x.dtype if name in stream else gemm
        if t.dtype != want:
            kind = "x's dtype (the residual stream)" if name in stream else "qkv_weight's dtype (the GEMM dtype)"
            raise ValueError(f"{name} (shape {tuple(t.shape)}) must be {want}, {kind}, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} (shape {tuple(t.shape)}) is on {t.device} but x is on {x.device}")
    if cu_seqlens.device != x.device:
        raise ValueError(
            f"cu_seqlens (shape {tuple(cu_seqlens.shape)}) is on {cu_seqlens.device} but x is on {x.device}"
        )


def vit_block(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    w: BlockWeights,
    num_heads: int,
    *,
    eps: float = 1e-6,
    scale: float | None = None,
    return_cls_attn: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One pre-norm ViT block on packed rows (inference only).

    Args:
        x: [T, C] float16/bfloat16/float32, the residual stream; sequence b is rows [cu[b], cu[b+1]).
        cu_seqlens: [B+1] int32/int64 on x's device, 0 = cu[0] <= ... <= cu[B] <= T; rows >= cu[B] are dead.
        w: BlockWeights (norms and LayerScales in x's dtype, Linear weights and biases in one GEMM dtype).
        num_heads: H, dividing C.
        eps: both LayerNorms' epsilon.
        scale: softmax scale, default 1/sqrt(C/H).
        return_cls_attn: also return cls_attn [T] float32 (the attention each sequence's first row pays to each
            row, mean over heads).

    Returns:
        y [T, C] in x's dtype (zeros on the dead rows), and cls_attn when asked.

    CPU tensors run vit_block_reference; eager CUDA tensors the block engine (or the per-op kernels where it does
    not take the call); under torch.compile / torch.export (or with fake tensors) the call goes through
    `torch.ops.raggedvit.vit_block`.
    """
    check_block_args(x, cu_seqlens, w, num_heads)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(x.shape[1] // num_heads)
    tensors = (x, cu_seqlens, *w)
    if torch.compiler.is_compiling() or any(t is not None and type(t) is not torch.Tensor for t in tensors):
        y, cls_attn = vit_block_op(x, cu_seqlens, *w, int(num_heads), float(eps), scale, bool(return_cls_attn))
        return (y, cls_attn) if return_cls_attn else y
    if x.is_cuda:
        y, cls_attn = vit_block_cuda(x, cu_seqlens, w, num_heads, eps=eps, scale=scale, return_cls_attn=return_cls_attn)
        return (y, cls_attn) if return_cls_attn else y
    return vit_block_reference(x, cu_seqlens, w, num_heads, eps=eps, scale=scale, return_cls_attn=return_cls_attn)
