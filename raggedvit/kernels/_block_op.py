"""`torch.ops.raggedvit.vit_block`: one whole pre-norm ViT block on packed rows, as seen by torch.compile /
torch.export.

Schema: (x [T, C], cu_seqlens [B+1] int32/int64,
         norm1_weight [C], norm1_bias [C], qkv_weight [3C, C], qkv_bias [3C]?, proj_weight [C, C], proj_bias [C]?,
         norm2_weight [C], norm2_bias [C], fc1_weight [F, C], fc1_bias [F]?, fc2_weight [C, F], fc2_bias [C]?,
         ls1 [C]?, ls2 [C]?, num_heads, eps, scale, return_cls_attn)
        -> (y [T, C] x.dtype, cls_attn [T] float32, or [0] when not requested).
The semantics are `raggedvit.kernels.reference.vit_block_reference` (BlockWeights' field order is the schema's).
CPU: that reference. CUDA: the block engine (raggedvit.kernels.block_engine) where it takes the call, else the
per-op kernels (`vit_block_ops`: ragged linear + ragged attention + LayerNorm). The fake implementation reads
shapes only (T may be unbacked, e.g. from nonzero under export).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raggedvit.kernels.ragged_attention import ragged_attention
from raggedvit.kernels.ragged_linear import ragged_linear
from raggedvit.kernels.reference import BlockWeights, vit_block_reference

__all__ = ["vit_block_cuda", "vit_block_op", "vit_block_ops"]


def vit_block_ops(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    w: BlockWeights,
    num_heads: int,
    *,
    eps: float,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block from raggedvit's per-op kernels (any device): LayerNorm, ragged linear (bias / GELU fused),
    ragged attention; the same roundings as vit_block_reference plus one: LN outputs are rounded to the GEMM dtype
    (the GEMM reads them from memory). Dead rows (>= cu[B]) are zero. -> (y [T, C], cls_attn [T] or [0])."""
    C = x.shape[1]
    gemm = w.qkv_weight.dtype
    live = torch.arange(x.shape[0], device=x.device) < cu_seqlens[-1].to(torch.int64).clamp(0, x.shape[0])

    def norm(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(a.float(), (C,), weight.float(), bias.float(), eps).to(gemm)

    def gamma(ls: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor:
        return a.float() if ls is None else a.float() * ls.float()

    qkv = ragged_linear(norm(x, w.norm1_weight, w.norm1_bias), w.qkv_weight, w.qkv_bias, cu_seqlens=cu_seqlens)
    res = ragged_attention(qkv, cu_seqlens, num_heads, scale=scale, return_cls_attn=return_cls_attn)
    o, cls_attn = res if return_cls_attn else (res, x.new_zeros((0,), dtype=torch.float32))
    p = ragged_linear(o, w.proj_weight, w.proj_bias, cu_seqlens=cu_seqlens)
    x1 = (x.float() + gamma(w.ls1, p)).to(x.dtype)
    a = ragged_linear(norm(x1, w.norm2_weight, w.norm2_bias), w.fc1_weight, w.fc1_bias, cu_seqlens=cu_seqlens,
                      activation=1)  # fmt: skip
    m = ragged_linear(a, w.fc2_weight, w.fc2_bias, cu_seqlens=cu_seqlens)
    y = torch.where(live[:, None], x1.float() + gamma(w.ls2, m), 0.0).to(x.dtype)
    return y, cls_attn


def vit_block_cuda(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    w: BlockWeights,
    num_heads: int,
    *,
    eps: float,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA tensors: the block engine when it is installed and takes the call (it raises TypeError for a case it
    does not support), else `vit_block_ops`."""
    try:
        from raggedvit.kernels.block_engine import vit_block_engine
    except ImportError:
        vit_block_engine = None
    if vit_block_engine is not None:
        try:
            res = vit_block_engine(x, cu_seqlens, w, num_heads, eps=eps, scale=scale, return_cls_attn=return_cls_attn)
        except TypeError:
            pass
        else:
            if return_cls_attn:
                return res[0], res[1]
            return res, x.new_zeros((0,), dtype=torch.float32)
    return vit_block_ops(x, cu_seqlens, w, num_heads, eps=eps, scale=scale, return_cls_attn=return_cls_attn)


@torch.library.custom_op("raggedvit::vit_block", mutates_args=())
def vit_block_op(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    norm1_weight: torch.Tensor,
    norm1_bias: torch.Tensor,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor | None,
    norm2_weight: torch.Tensor,
    norm2_bias: torch.Tensor,
    fc1_weight: torch.Tensor,
    fc1_bias: torch.Tensor | None,
    fc2_weight: torch.Tensor,
    fc2_bias: torch.Tensor | None,
    ls1: torch.Tensor | None,
    ls2: torch.Tensor | None,
    num_heads: int,
    eps: float,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError(f"raggedvit::vit_block has no kernel for device {x.device}")


def _weights(*tensors: torch.Tensor | None) -> BlockWeights:
    return BlockWeights(*(t if t is None else t.contiguous() for t in tensors))


@vit_block_op.register_kernel("cpu")
def _cpu_kernel(x, cu_seqlens, n1w, n1b, qw, qb, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b, ls1, ls2, num_heads, eps,
                scale, return_cls_attn):  # fmt: skip
    w = _weights(n1w, n1b, qw, qb, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b, ls1, ls2)
    res = vit_block_reference(x, cu_seqlens, w, num_heads, eps=eps, scale=scale, return_cls_attn=return_cls_attn)
    if return_cls_attn:
        return res[0], res[1]
    return res, x.new_zeros((0,), dtype=torch.float32)


@vit_block_op.register_kernel("cuda")
def _cuda_kernel(x, cu_seqlens, n1w, n1b, qw, qb, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b, ls1, ls2, num_heads, eps,
                 scale, return_cls_attn):  # fmt: skip
    w = _weights(n1w, n1b, qw, qb, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b, ls1, ls2)
    with torch.cuda.device(x.device):
        return vit_block_cuda(
            x.contiguous(), cu_seqlens.contiguous(), w, num_heads, eps=eps, scale=scale,
            return_cls_attn=return_cls_attn,
        )  # fmt: skip


@vit_block_op.register_fake
def _fake(x, cu_seqlens, n1w, n1b, qw, qb, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b, ls1, ls2, num_heads, eps, scale,
          return_cls_attn):  # fmt: skip
    T = x.shape[0]
    return x.new_empty((T, x.shape[1])), x.new_empty((T if return_cls_attn else 0,), dtype=torch.float32)
