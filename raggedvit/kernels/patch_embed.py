"""A ViT's patch embedding + prefix rows + position table as one pass: the kernel of `com.raggedvit::PatchEmbed`
(exporter rule `patch_embed`, raggedvit/exporter/rules/).

`patch_embed(images, weight, prefix, pos, patch)` returns [B, P + L, N] float16 rows: the prefix rows
(prefix + pos[:P]) then each patch's embedding (the patch's pixels rounded to float16 @ weight + pos[P:]): the
Triton kernel `_embed_kernel._patch_embed` on CUDA tensors, else the torch reference `patch_embed_reference` (the
kernel runs on CPU tensors through `_launch_patch_embed` in a process started with TRITON_INTERPRET=1: the tests).
The ONNX op's AOT cubins are the same kernel; its CPU EP kernel computes the same function.
"""

from __future__ import annotations

from types import ModuleType

import torch

from raggedvit.kernels._embed_kernel import EmbedConfig, embed_config

__all__ = ["patch_embed", "patch_embed_reference", "patch_grid"]


def patch_grid(images: torch.Tensor, patch: int) -> tuple[int, int]:
    """(gh, gw) of a stride-`patch` conv over images [B, C, H, W]."""
    return images.shape[2] // patch, images.shape[3] // patch


def _check(images: torch.Tensor, weight: torch.Tensor, prefix: torch.Tensor, pos: torch.Tensor, patch: int) -> None:
    if images.dim() != 4 or images.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"images must be 4-D [B, C, H, W] float32 / float16, got {images.dtype} "
                         f"{tuple(images.shape)}")  # fmt: skip
    if patch < 1:
        raise ValueError(f"patch must be >= 1, got {patch}")
    B, C, H, W = images.shape
    gh, gw = patch_grid(images, patch)
    K = C * patch * patch
    where = f"images {tuple(images.shape)}, patch {patch}"
    if weight.dim() != 2 or weight.shape[0] != K or weight.dtype != torch.float16:
        raise ValueError(f"weight must be [K = {K}, N] float16 ({where}), got {weight.dtype} {tuple(weight.shape)}")
    N = weight.shape[1]
    if prefix.dim() != 2 or prefix.shape[1] != N or prefix.dtype != torch.float32:
        raise ValueError(f"prefix must be [P, {N}] float32, got {prefix.dtype} {tuple(prefix.shape)}")
    rows = prefix.shape[0] + gh * gw
    if tuple(pos.shape) != (rows, N) or pos.dtype != torch.float32:
        raise ValueError(f"pos must be [P + L = {rows}, {N}] float32 ({where}), got {pos.dtype} {tuple(pos.shape)}")
    for name, t in (("weight", weight), ("prefix", prefix), ("pos", pos)):
        if t.device != images.device:
            raise ValueError(f"{name} must be on images' device {images.device}, got {t.device}")


def patch_embed_reference(
    images: torch.Tensor,
    weight: torch.Tensor,
    prefix: torch.Tensor,
    pos: torch.Tensor,
    patch: int,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """images [B, C, H, W], weight [K, N], prefix [P, N], pos [P + L, N] -> [B, P + L, N] float16 (kept in
    compute_dtype when it is float64): patches of the (gh * patch, gw * patch) corner, pixels rounded to float16,
    k = (c * patch + ky) * patch + kx."""
    B, C = images.shape[:2]
    gh, gw = patch_grid(images, patch)
    P, N = prefix.shape
    px = images[:, :, : gh * patch, : gw * patch].to(torch.float16).to(compute_dtype)
    px = px.reshape(B, C, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * patch * patch)
    body = px @ weight.to(compute_dtype) + pos[P:].to(compute_dtype)
    head = (prefix.to(compute_dtype) + pos[:P].to(compute_dtype)).expand(B, P, N)
    out = torch.cat([head, body], dim=1)
    return out if compute_dtype == torch.float64 else out.to(torch.float16)


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _embed_kernel

    return _embed_kernel


def _launch_patch_embed(
    images: torch.Tensor,
    weight: torch.Tensor,
    prefix: torch.Tensor,
    pos: torch.Tensor,
    patch: int,
    *,
    kernels: ModuleType | None = None,
    config: EmbedConfig | None = None,
) -> torch.Tensor:
    """Validated, contiguous tensors (CUDA on the current device, or CPU under TRITON_INTERPRET=1) -> [B, P + L, N]
    float16. `config` defaults to `embed_config(B * L)`."""
    B, C, H, W = images.shape
    gh, gw = patch_grid(images, patch)
    P, N = prefix.shape
    L = gh * gw
    out = torch.empty((B, P + L, N), dtype=torch.float16, device=images.device)
    if out.numel() == 0:
        return out
    cfg = embed_config(B * L) if config is None else config
    k = _default_kernels() if kernels is None else kernels
    tiles_m = -(-(B * L) // cfg.block_m) + -(-(B * P) // cfg.block_m)
    grid = (tiles_m * -(-N // cfg.block_n),)
    k._patch_embed[grid](
        images, weight, prefix, pos, out, B, C, H, W, gw, L, P, N, weight.shape[0], patch,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def patch_embed(
    images: torch.Tensor, weight: torch.Tensor, prefix: torch.Tensor, pos: torch.Tensor, patch: int
) -> torch.Tensor:
    """Patch embedding with prefix rows and position table (inference only).

    Args:
        images: [B, C, H, W] float32 / float16.
        weight: [K, N] float16, K = C * patch * patch (Conv2d's weight [N, C, patch, patch] flattened, transposed).
        prefix: [P, N] float32 (class / distillation tokens; P may be 0).
        pos: [P + L, N] float32, L = (H // patch) * (W // patch) (the position table, the conv's bias folded into
            its patch rows).
        patch: the conv's kernel size and stride.

    Returns:
        [B, P + L, N] float16.
    """
    _check(images, weight, prefix, pos, patch)
    if images.is_cuda:
        c = [t.contiguous() for t in (images, weight, prefix, pos)]
        with torch.cuda.device(images.device):
            return _launch_patch_embed(*c, patch)
    return patch_embed_reference(images, weight, prefix, pos, patch)
