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

__all__ = ["find_checkpoint", "load_recipe", "load_reference", "run_reference"]


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


def find_checkpoint(weights: dict[str, Any], model_path: str | Path | None, given: str | Path | None) -> Path:
    """The checkpoint file of an export's `weights` recipe, looked up in order: `given` (--checkpoint), the recorded
    path relative to the model file's directory, the current directory (by its recorded name). Its sha256 must be
    the recorded one. ValidationInputError (one line, naming the places tried) otherwise."""
    from raggedvit.weights import sha256_file

    name = str(weights.get("checkpoint") or "")
    if given is not None:
        tried = [(Path(given), "--checkpoint")]
    else:
        tried = []
        rel = weights.get("checkpoint_relpath") or weights.get("checkpoint_path")
        if rel and model_path is not None and not Path(rel).is_absolute():
            tried.append((Path(model_path).parent / rel, "relative to the model"))
        if name:
            tried.append((Path(name), "in the current directory"))
    path = next((p for p, _ in tried if p.is_file()), None)
    if path is None:
        places = " and ".join(f"{str(p)!r} ({where})" for p, where in tried) or "nowhere (no recorded name)"
        raise ValidationInputError(f"checkpoint {name!r} not found: tried {places}; pass --checkpoint FILE")
    expected = weights.get("checkpoint_sha256")
    if expected:
        actual = sha256_file(path)
        if actual != expected:
            raise ValidationInputError(
                f"checkpoint {str(path)!r} has sha256 {actual[:16]}..., the export recorded {expected[:16]}...: "
                "not the exported weights"
            )
    return path


def load_reference(
    recipe: dict[str, Any], *, checkpoint: str | Path | None = None, model_path: str | Path | None = None
) -> tuple[Any, Any]:
    """(timm VisionTransformer in fp32 eval mode with the exported weights, PruneSpec) from `recipe`.

    Checkpoint weights are looked up by `find_checkpoint`: `checkpoint` (if given), then relative to the model file
    at `model_path`, then in the current directory; their sha256 must match the recorded one.
    """
    from raggedvit.pruning import PruneSpec
    from raggedvit.weights import load_vit

    try:
        w = recipe["weights"]
        name, source, img_size = recipe["model"], w["source"], int(recipe["img_size"])
        spec = PruneSpec.from_dict(recipe["prune"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValidationInputError(f"incomplete export recipe ({type(e).__name__}: {e})") from None
    kwargs: dict[str, Any] = {"img_size": img_size, "sharpen_qk": float(w.get("sharpen_qk", 1.0))}
    if source == "checkpoint":
        kwargs["checkpoint"] = find_checkpoint(w, model_path, checkpoint)
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

    from raggedvit.pruning import build_pruned_vit

    model = build_pruned_vit(vit, spec)
    logits, counts = [], []
    chunks = range(0, images.shape[0], batch_size)
    with torch.no_grad():
        for s in tqdm(chunks, desc="pytorch reference", disable=None if progress else True, leave=False):
            out = model(images[s : s + batch_size])
            logits.append(out.logits.float().numpy())
            counts.append(out.token_counts.numpy())
    return np.concatenate(logits), np.concatenate(counts)
