"""Whether a model can export with com.raggedvit::RaggedLinear nodes: the CUDA EP kernel's conditions, checked before
any tracing (build_model, and the CLI's `export --ragged-linear` for its one-line error)."""

from __future__ import annotations

from torch import nn

__all__ = ["RAGGED_LINEAR_ALIGN", "RAGGED_LINEAR_DTYPES", "check_ragged_linear"]

RAGGED_LINEAR_ALIGN = 16  # K and N of every RaggedLinear GEMM: the CUDA cubins are built for multiples of 16
RAGGED_LINEAR_DTYPES = ("fp16", "fp16-all")  # the CUDA EP's RaggedLinear has no float32 kernel


def check_ragged_linear(vit: nn.Module, dtype: str) -> None:
    """Raise ValueError (one line) unless `vit` exported in recipe `dtype` can use RaggedLinear nodes: a timm
    VisionTransformer (a backbone with supports_ragged_linear), an fp16 / fp16-all recipe, and every block GEMM's
    K and N (qkv, attn.proj, mlp.fc1, mlp.fc2) a multiple of RAGGED_LINEAR_ALIGN.

    PrunedViT refuses the first too, in its own words; this check names the export's option and runs first."""
    from raggedvit.pruning.families import backbone_for

    backbone = backbone_for(vit)
    if not backbone.supports_ragged_linear:
        raise ValueError(f"ragged linear needs a timm VisionTransformer, got {type(vit).__name__}")
    if dtype not in RAGGED_LINEAR_DTYPES:
        raise ValueError(f"ragged linear needs an fp16 / fp16-all export (no fp32 CUDA kernel), got dtype {dtype!r}")
    for i, block in enumerate(backbone.blocks):
        for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
            layer = _submodule(block, name)
            if not isinstance(layer, nn.Linear):
                continue
            n, k = layer.weight.shape
            if n % RAGGED_LINEAR_ALIGN or k % RAGGED_LINEAR_ALIGN:
                raise ValueError(
                    f"ragged linear needs K and N multiples of {RAGGED_LINEAR_ALIGN}: blocks.{i}.{name} has "
                    f"weight [N={n}, K={k}]"
                )


def _submodule(module: nn.Module, name: str) -> nn.Module | None:
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None
