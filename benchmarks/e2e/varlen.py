"""torch's own varlen (flash) attention as a `PrunedViT(attention=...)` hook: the `torch_varlen` variant.

The hook has the signature and semantics of `raggedvit.kernels.ragged_attention` (DESIGN.md section 1):
out from a varlen core, cls_attn (when asked) from the CLS rows' q against each sequence's keys, padded to
max_seqlen slots per sequence (no host reads).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["VarlenAttention", "cls_attention", "pick_varlen_core"]

# core(q, k, v, cu32, max_seqlen, scale) -> out [T, H, D]; q, k, v [T, H, D] (row stride 3*H*D)
Core = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def cls_attention(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, scale: float):
    """cls_attn [T] float32: for row t of sequence b, mean over heads of softmax_j(q[cu[b]] . k[cu[b] + j] * scale)
    at j = t - cu[b]. q, k [T, H, D]; cu_seqlens [B+1]; every sequence length must be <= max_seqlen."""
    T = q.shape[0]
    cu = cu_seqlens.to(torch.int64)
    n = cu[1:] - cu[:-1]  # [B]
    slot = torch.arange(max_seqlen, device=q.device)
    valid = slot < n[:, None]  # [B, W]
    rows = torch.where(valid, cu[:-1, None] + slot, T)  # [B, W]; T = a dump slot
    k_pad = k[rows.clamp_max(max(T - 1, 0))].float()  # [B, W, H, D]
    q_cls = q[cu[:-1].clamp_max(max(T - 1, 0))].float()  # [B, H, D]
    s = torch.einsum("bhd,bwhd->bhw", q_cls, k_pad) * scale  # [B, H, W]
    p = torch.softmax(s.masked_fill(~valid[:, None, :], float("-inf")), dim=-1).mean(dim=1)  # [B, W]
    out = torch.zeros(T + 1, dtype=torch.float32, device=q.device)
    return out.scatter(0, rows.reshape(-1), p.reshape(-1))[:T]


def _varlen_attn_core() -> Core:
    from torch.nn.attention.varlen import varlen_attn

    def core(q, k, v, cu32, max_seqlen, scale):
        D = q.shape[-1]
        if abs(scale - D**-0.5) <= 1e-9 * D**-0.5:  # the default: works on every torch that has varlen_attn
            return varlen_attn(q, k, v, cu32, cu32, max_seqlen, max_seqlen)
        return varlen_attn(q, k, v, cu32, cu32, max_seqlen, max_seqlen, scale=scale)

    return core


def _flash_forward_core() -> Core:
    op = torch.ops.aten._flash_attention_forward

    def core(q, k, v, cu32, max_seqlen, scale):
        return op(q, k, v, cu32, cu32, max_seqlen, max_seqlen, 0.0, False, False, scale=scale)[0]

    return core


CORES: dict[str, Callable[[], Core]] = {
    "torch.nn.attention.varlen.varlen_attn": _varlen_attn_core,
    "torch.ops.aten._flash_attention_forward": _flash_forward_core,
}


def pick_varlen_core(device: torch.device, dtype: torch.dtype, heads: int = 2, dim: int = 64) -> tuple[Core, str]:
    """The first core in CORES that runs a small ragged case on `device` and matches a padded float32 SDPA.

    Returns (core, "name; max abs error ..."); raises RuntimeError with every core's failure otherwise.
    """
    g = torch.Generator().manual_seed(0)
    lengths = [5, 1, 17]
    T = sum(lengths)
    qkv = torch.randn(T, 3, heads, dim, generator=g).to(device, dtype)
    q, k, v = qkv.unbind(1)
    cu32 = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    scale = dim**-0.5
    want = []
    for b in range(len(lengths)):
        sl = slice(int(cu32[b]), int(cu32[b + 1]))
        qb, kb, vb = (t[sl].transpose(0, 1).float() for t in (q, k, v))
        want.append(torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, scale=scale).transpose(0, 1))
    want_t = torch.cat(want)
    failures = []
    for name, make in CORES.items():
        try:
            core = make()
            got = core(q, k, v, cu32, max(lengths), scale).float()
            err = float((got - want_t).abs().max())
            if not err < 2e-2:
                raise RuntimeError(f"max abs error {err:.3g} vs padded SDPA")
            return core, f"{name}; max abs error {err:.2g} on a 3-sequence check"
        except Exception as exc:  # noqa: BLE001 - try the next core
            failures.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    raise RuntimeError("no varlen attention core works: " + " | ".join(failures))


class VarlenAttention:
    """Callable with `ragged_attention`'s signature backed by a varlen core.

    __call__(qkv [T, 3*H*D], cu_seqlens [B+1], num_heads, *, scale, max_seqlen, return_cls_attn)
        -> out [T, H*D] (qkv.dtype), or (out, cls_attn [T] float32).
    """

    def __init__(self, core: Core) -> None:
        self.core = core

    def __call__(
        self,
        qkv: torch.Tensor,
        cu_seqlens: torch.Tensor,
        num_heads: int,
        *,
        scale: float | None = None,
        max_seqlen: int | None = None,
        return_cls_attn: bool = False,
    ):
        T = qkv.shape[0]
        H = num_heads
        D = qkv.shape[1] // (3 * H)
        if scale is None:
            scale = 1.0 / math.sqrt(D)
        if max_seqlen is None:
            raise ValueError("VarlenAttention needs max_seqlen (a static upper bound of the sequence lengths)")
        q, k, v = qkv.view(T, 3, H, D).unbind(1)  # each [T, H, D], row stride 3*H*D
        cu32 = cu_seqlens.to(torch.int32)
        out = self.core(q, k, v, cu32, int(max_seqlen), float(scale)).reshape(T, H * D)
        if not return_cls_attn:
            return out
        return out, cls_attention(q, k, cu_seqlens, int(max_seqlen), float(scale))
