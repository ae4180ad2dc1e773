"""The export recipe stored in the ONNX metadata_props: enough to rebuild the PyTorch reference; and the pass that
strips the metadata torch.onnx writes about the exporting machine (strip_local_metadata)."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import onnx

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "LOCAL_METADATA_KEYS",
    "LOCAL_METADATA_PREFIX",
    "RAGGED_DOMAIN",
    "RECIPE_KEY",
    "checkpoint_relpath",
    "read_recipe",
    "strip_local_metadata",
    "write_recipe",
    "write_recipe_ir",
]

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


# Metadata torch.onnx writes about where each node came from: stack traces (absolute paths of the exporting machine's
# source tree and site-packages), FX node names, module scopes. None of it is needed to run or validate the model.
LOCAL_METADATA_PREFIX = "pkg.torch."
LOCAL_METADATA_KEYS = ("namespace",)


def _drop_local(props: dict[str, str]) -> None:
    for key in [k for k in props if k.startswith(LOCAL_METADATA_PREFIX) or k in LOCAL_METADATA_KEYS]:
        del props[key]


def strip_local_metadata(model: ir.Model) -> ir.Model:
    """Remove the metadata keyed LOCAL_METADATA_PREFIX* or LOCAL_METADATA_KEYS from the model, every graph and
    function, node and value, and the doc_string of every node and value (torch.onnx may put source text there):
    the same export is then byte-identical on every machine and from every directory. In place; returns `model`."""
    import onnx_ir as ir  # here: reading a recipe does not pay for onnx_ir's import

    def scrub(obj: ir.Node | ir.Value) -> None:
        _drop_local(obj.metadata_props)
        if obj.doc_string:
            obj.doc_string = None

    _drop_local(model.metadata_props)
    for graph in (model.graph, *model.functions.values()):
        _drop_local(graph.metadata_props)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            scrub(node)
            for value in (*node.inputs, *node.outputs):
                if value is not None:
                    scrub(value)
        for value in (*graph.inputs, *graph.outputs, *graph.initializers.values()):
            scrub(value)
    return model
