"""Build a timm ViT with known weights: a checkpoint file, timm's pretrained weights, or a seeded random init."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import vision_transformer
from torch import nn

from raggedvit.policies import REGISTRY

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "WeightsInfo",
    "load_checkpoint",
    "load_vit",
    "nonfinite_tensors",
    "perturb_biases_and_norms_",
    "sha256_file",
    "sharpen_qk_",
]

CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
DEFAULT_SHARPEN_QK = 4.0


@dataclass(frozen=True)
class WeightsInfo:
    """Where a model's weights came from (written into export metadata and benchmark results)."""

    model_name: str
    source: str  # "checkpoint" | "pretrained" | "seeded"
    checkpoint: str | None
    checkpoint_sha256: str | None
    seed: int | None
    sharpen_qk: float
    img_size: tuple[int, int]
    num_classes: int
    num_prefix_tokens: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        return d


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from .pth/.pt/.bin (torch.load, weights_only) or .safetensors; unwraps
    {'state_dict': ...} and {'model': ...}."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    if path.suffix not in CHECKPOINT_SUFFIXES:
        raise ValueError(f"checkpoint {path.name!r}: unsupported suffix, expected {', '.join(CHECKPOINT_SUFFIXES)}")
    if path.stat().st_size == 0:
        raise ValueError(f"checkpoint {path.name!r} is empty (0 bytes)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            import argparse

            # training scripts (DeiT's, EViT's, DynamicViT's) save their argparse Namespace beside the model
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (OSError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure (torch raises IndexError on some truncations)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"cannot read checkpoint {path.name!r}: {type(e).__name__}: {first}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint {path.name!r} does not hold a state dict of tensors")
    return state


@torch.no_grad()
def nonfinite_tensors(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers of `model` that hold a NaN or an Inf."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


@torch.no_grad()
def sharpen_qk_(model: torch.nn.Module, factor: float) -> None:
    """Multiply the q and k rows of every attention `qkv` weight (and bias) by `factor`, in place.

    Attention logits scale by factor**2, so seeded random weights give peaked attention and pruning
    decisions that are not near-ties. Every timm attention layout: a fused `qkv` Linear (its bias, or separate
    `q_bias` / `k_bias` parameters as in BEiT and EVA), separate `q_proj` / `k_proj` (EVA) or `q` / `k` (CaiT's
    class attention)."""
    for mod in model.modules():
        qkv = getattr(mod, "qkv", None)
        if isinstance(qkv, nn.Linear) and qkv.out_features % 3 == 0:
            rows = 2 * qkv.out_features // 3
            qkv.weight[:rows].mul_(factor)
            if qkv.bias is not None:
                qkv.bias[:rows].mul_(factor)
            for name in ("q_bias", "k_bias"):
                bias = getattr(mod, name, None)
                if isinstance(bias, torch.Tensor) and bias.is_floating_point():
                    bias.mul_(factor)
            continue
        for q_name, k_name in (("q_proj", "k_proj"), ("q", "k")):
            q, k = getattr(mod, q_name, None), getattr(mod, k_name, None)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
                for lin in (q, k):
                    lin.weight.mul_(factor)
                    if lin.bias is not None:
                        lin.bias.mul_(factor)
                break


def perturb_biases_and_norms_(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> torch.nn.Module:
    """Add scale * N(0, 1) to every bias (BEiT's and Eva's q / v biases too), LayerNorm gain, token (cls / reg /
    dist / pos), LayerScale gamma (BEiT's and Eva's gamma_1 / gamma_2) and relative position bias table.

    timm initialises Linear biases and LayerNorm shifts to 0 and gains to 1, so seeded weights alone cannot show
    an export that drops or misplaces one of them; real checkpoints have them all. In place; returns `model`."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if (
                leaf in ("bias", "gamma", "q_bias", "v_bias", "gamma_1", "gamma_2", "relative_position_bias_table")
                or (leaf == "weight" and "norm" in name)
                or "token" in name
                or "pos_embed" in name
            ):
                p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def _create(model_name: str, pretrained: bool, img_size: int | None, kwargs: dict[str, Any]) -> nn.Module:
    if not timm.is_model(model_name):
        raise ValueError(f"unknown timm model {model_name!r}")
    extra = dict(kwargs)
    if img_size is not None:
        extra["img_size"] = img_size
    try:
        model = timm.create_model(model_name, pretrained=pretrained, **extra)
    except TypeError as e:
        raise ValueError(f"cannot build {model_name!r} with {extra}: {e}") from None
    from raggedvit.pruning.families import backbone_for

    try:
        backbone_for(model)
    except ValueError as e:
        raise ValueError(f"{model_name!r} is a timm {type(model).__name__}, not a ViT raggedvit runs: {e}") from None
    return model


def _checkpoint_filter(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """timm's checkpoint filter of the model's own family (pos-embed resizing, renamed keys), ViT's by default."""
    module = sys.modules.get(type(model).__module__)
    fn = getattr(module, "checkpoint_filter_fn", vision_transformer.checkpoint_filter_fn)
    return fn(state, model)


def load_vit(
    model_name: str,
    *,
    checkpoint: str | Path | None = None,
    pretrained: bool = False,
    seed: int | None = None,
    img_size: int | None = None,
    sharpen_qk: float | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[nn.Module, WeightsInfo]:
    """Create a timm ViT in eval mode.

    Args:
        model_name: a timm model name PrunedViT runs (raggedvit.pruning.families.supported_classes()).
        checkpoint: .pth/.pt/.bin/.safetensors state dict, passed through timm's ViT checkpoint filter
            (pos-embed resizing etc.) and loaded strictly. Keys of a learned pruning policy (DynamicViT's
            `score_predictor.*`) are kept with the model for raggedvit.pruning.build_pruned_vit
            (raggedvit.pruning.policy_state(model)).
        pretrained: download timm's weights (needs network).
        seed: random init seed (default 0 when neither checkpoint nor pretrained is given).
        img_size: input resolution override (timm resizes pos embeds of checkpoints).
        sharpen_qk: q/k row scale (default 4.0 for seeded random weights, 1.0 otherwise).
        model_kwargs: extra timm.create_model arguments (e.g. depth for small test models).

    Returns:
        (model, WeightsInfo).
    """
    if checkpoint is not None and pretrained:
        raise ValueError("give either checkpoint or pretrained=True, not both")
    random_init = checkpoint is None and not pretrained
    if random_init and seed is None:
        seed = 0
    if sharpen_qk is None:
        sharpen_qk = DEFAULT_SHARPEN_QK if random_init else 1.0
    if seed is not None:
        torch.manual_seed(seed)
    state = load_checkpoint(checkpoint) if checkpoint is not None else None  # a bad file fails before the build
    policy_keys: dict[str, torch.Tensor] = {}
    if state is not None:  # a learned pruning policy's weights (DynamicViT's predictors) stay with the model
        prefixes = tuple(p.state_prefix for p in REGISTRY.values() if p.learned)
        policy_keys = {k: v for k, v in state.items() if k.startswith(prefixes)}
        state = {k: v for k, v in state.items() if k not in policy_keys}
    model = _create(model_name, pretrained, img_size, model_kwargs or {})
    ckpt_name = ckpt_sha = None
    if checkpoint is not None:
        try:
            result = model.load_state_dict(_checkpoint_filter(state, model), strict=False)
        except RuntimeError as e:  # shape mismatches raise even with strict=False
            lines = [" ".join(line.split()) for line in str(e).splitlines() if "size mismatch" in line]
            detail = "; ".join(lines[:4]) + (f"; and {len(lines) - 4} more" if len(lines) > 4 else "")
            raise ValueError(
                f"checkpoint {Path(checkpoint).name!r} does not match {model_name}: "
                + (detail or " ".join(str(e).split())[:500])
            ) from None
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"checkpoint {Path(checkpoint).name!r} does not match {model_name}: "
                f"missing keys {result.missing_keys[:8]}, unexpected keys {result.unexpected_keys[:8]}"
            )
        ckpt_name, ckpt_sha = Path(checkpoint).name, sha256_file(checkpoint)
    if sharpen_qk != 1.0:
        sharpen_qk_(model, sharpen_qk)
    from raggedvit.pruning.factory import set_policy_state
    from raggedvit.pruning.families import backbone_for

    set_policy_state(model, policy_keys)
    model.eval()
    info = WeightsInfo(
        model_name=model_name,
        source="checkpoint" if checkpoint is not None else ("pretrained" if pretrained else "seeded"),
        checkpoint=ckpt_name,
        checkpoint_sha256=ckpt_sha,
        seed=seed,
        sharpen_qk=float(sharpen_qk),
        img_size=tuple(int(s) for s in model.patch_embed.img_size),
        num_classes=int(model.num_classes),
        num_prefix_tokens=backbone_for(model).num_prefix,
    )
    return model, info
