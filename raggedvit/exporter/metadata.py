"""The export recipe stored in the ONNX metadata_props: enough to rebuild the PyTorch reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import onnx

__all__ = ["RECIPE_KEY", "file_sha256", "read_recipe", "weights_source", "write_recipe"]

RECIPE_KEY = "raggedvit.recipe"


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_source(*, checkpoint: str | Path | None = None, pretrained: bool = False, seed: int | None = None) -> dict:
    """How the weights were obtained: {"kind": "checkpoint", "file", "path", "sha256"} | {"kind": "pretrained"} |
    {"kind": "seed", "seed": N} (the recipe's `weights` entry)."""
    if checkpoint is not None:
        p = Path(checkpoint).resolve()
        return {"kind": "checkpoint", "file": p.name, "path": str(p), "sha256": file_sha256(p)}
    if pretrained:
        return {"kind": "pretrained"}
    return {"kind": "seed", "seed": int(seed or 0)}


def write_recipe(model: onnx.ModelProto, recipe: dict[str, Any]) -> None:
    """Store `recipe` as JSON under RECIPE_KEY (replacing an earlier one)."""
    props = [p for p in model.metadata_props if p.key != RECIPE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    entry = model.metadata_props.add()
    entry.key = RECIPE_KEY
    entry.value = json.dumps(recipe, sort_keys=True)


def read_recipe(model: onnx.ModelProto | str | Path) -> dict[str, Any]:
    """The recipe dict of an exported model (path or ModelProto); KeyError if it has none."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    for p in model.metadata_props:
        if p.key == RECIPE_KEY:
            return json.loads(p.value)
    raise KeyError(f"no '{RECIPE_KEY}' metadata: not exported by raggedvit")
