"""Rebuild the PyTorch reference (timm ViT + PruneSpec) from an exported model's recipe, and run it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from raggedvit.exporter.metadata import read_recipe
from raggedvit.validators.errors import ValidationInputError

if TYPE_CHECKING:  # torch stays unimported until a reference is built (fail-fast input checks)
    import torch
    from torch import nn

    from raggedvit.pruning import PruneSpec

__all__ = ["load_recipe", "load_reference", "run_reference"]


def load_recipe(model_path: str | Path) -> dict[str, Any]:
    """The recipe of an exported .onnx file; ValidationInputError if missing, unreadable or not raggedvit's."""
    path = Path(model_path)
    if not path.is_file():
        raise ValidationInputError(f"model file {str(path)!r} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends
        raise ValidationInputError(f"{path.name} is not a readable ONNX model ({type(e).__name__})") from None
    try:
        return read_recipe(model)
    except (KeyError, ValueError) as e:
        raise ValidationInputError(f"{path.name}: {e}") from None


def load_reference(recipe: dict[str, Any], *, checkpoint: str | Path | None = None) -> tuple[Any, Any]:
    """(timm VisionTransformer in fp32 eval mode with the exported weights, PruneSpec) from `recipe`.

    Checkpoint weights are looked up at `checkpoint` (if given) or at the recorded path; their sha256 must
    match the recorded one.
    """
    from raggedvit.pruning import PruneSpec
    from raggedvit.weights import load_vit, sha256_file

    try:
        w = recipe["weights"]
        name, source, img_size = recipe["model"], w["source"], int(recipe["img_size"])
        spec = PruneSpec.from_dict(recipe["prune"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValidationInputError(f"incomplete export recipe ({type(e).__name__}: {e})") from None
    kwargs: dict[str, Any] = {"img_size": img_size, "sharpen_qk": float(w.get("sharpen_qk", 1.0))}
    if source == "checkpoint":
        path = Path(checkpoint) if checkpoint is not None else Path(w.get("checkpoint_path") or w["checkpoint"])
        if not path.is_file():
            raise ValidationInputError(
                f"checkpoint {w.get('checkpoint')!r} not found at {str(path)!r}; pass --checkpoint FILE"
            )
        if w.get("checkpoint_sha256") and sha256_file(path) != w["checkpoint_sha256"]:
            raise ValidationInputError(f"checkpoint {str(path)!r} does not match the exported sha256")
        kwargs["checkpoint"] = path
    elif source == "pretrained":
        kwargs["pretrained"] = True
    elif source == "seeded":
        kwargs["seed"] = int(w["seed"])
    else:
        raise ValidationInputError(f"unknown weights source {source!r} in the export recipe")
    try:
        vit, _ = load_vit(name, **kwargs)
    except ValueError as e:
        raise ValidationInputError(str(e)) from None
    depth = recipe.get("depth")
    if depth is not None and int(depth) != len(vit.blocks):
        raise ValidationInputError(
            f"the export has {int(depth)} blocks but timm's {name} has {len(vit.blocks)}: "
            "the reference cannot be rebuilt from this recipe"
        )
    return vit.float().eval(), spec


def run_reference(vit: nn.Module, spec: PruneSpec, images: torch.Tensor, batch_size: int = 16, progress: bool = False):
    """PrunedViT(vit, spec) on images [N, 3, S, S] (CPU, in the model's dtype), in batches:
    (logits [N, classes] float32, token_counts [N, stages] int64) numpy. The validator's fp32 reference, and the
    precision floor's fp16 runs."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from raggedvit.pruning import PrunedViT

    model = PrunedViT(vit, spec)
    logits, counts = [], []
    chunks = range(0, images.shape[0], batch_size)
    with torch.no_grad():
        for s in tqdm(chunks, desc="pytorch reference", disable=None if progress else True, leave=False):
            out = model(images[s : s + batch_size])
            logits.append(out.logits.float().numpy())
            counts.append(out.token_counts.numpy())
    return np.concatenate(logits), np.concatenate(counts)
