"""The export recipe stored in the ONNX metadata_props: enough to rebuild the PyTorch reference."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

import onnx

__all__ = ["RAGGED_DOMAIN", "RECIPE_KEY", "checkpoint_relpath", "read_recipe", "write_recipe", "write_recipe_ir"]

RECIPE_KEY = "raggedvit.recipe"
RAGGED_DOMAIN = "com.raggedvit"  # custom op domain of RaggedAttention (DESIGN.md section 3)


def write_recipe(model: onnx.ModelProto, recipe: dict[str, Any]) -> None:
    """Store `recipe` as JSON under RECIPE_KEY (replacing an earlier one)."""
    props = [p for p in model.metadata_props if p.key != RECIPE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    entry = model.metadata_props.add()
    entry.key = RECIPE_KEY
    entry.value = json.dumps(recipe, sort_keys=True)


def read_recipe(model: onnx.ModelProto | str | Path) -> dict[str, Any]:
    """The recipe dict of an exported model (path or ModelProto); KeyError if it has none, ValueError if it is not a
    JSON object (the message says so and what to do)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    for p in model.metadata_props:
        if p.key == RECIPE_KEY:
            return _parse_recipe(p.value)
    raise KeyError(f"no '{RECIPE_KEY}' metadata: not exported by raggedvit")


def _parse_recipe(text: str) -> dict[str, Any]:
    fix = "the model was edited or not written by raggedvit export; export it again"
    try:
        recipe = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"its '{RECIPE_KEY}' metadata is malformed (not JSON: {e.msg} at line {e.lineno} column {e.colno}): {fix}"
        ) from None
    if not isinstance(recipe, dict):
        kind = type(recipe).__name__
        raise ValueError(f"its '{RECIPE_KEY}' metadata is malformed (a JSON {kind}, not an object): {fix}")
    return recipe


def write_recipe_ir(model: Any, recipe: dict[str, Any]) -> None:
    """Store `recipe` as JSON under RECIPE_KEY in an onnx_ir Model's metadata_props."""
    model.metadata_props[RECIPE_KEY] = json.dumps(recipe, sort_keys=True)


def checkpoint_relpath(checkpoint: str | Path, model_path: str | Path) -> str | None:
    """The checkpoint's path relative to the directory of the model file (forward slashes, as ONNX external data
    records its files): where `validate` looks for it first when the two keep their places. None where no
    relative path exists (another drive)."""
    try:
        rel = os.path.relpath(Path(checkpoint).resolve(), Path(model_path).resolve().parent)
    except ValueError:
        return None
    return PurePosixPath(*Path(rel).parts).as_posix()
