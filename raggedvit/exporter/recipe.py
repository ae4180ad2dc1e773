"""What an export records about itself: the model's header (IR version, producer, a doc_string naming the op library
it needs) and the recipe stored under metadata.RECIPE_KEY (the caller's recipe plus the prune spec, layout, dtype,
sizes, tensor names and version: enough to rebuild the PyTorch reference). Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import raggedvit
from raggedvit.describe import PRODUCER_NAME, doc_string, scrub_paths
from raggedvit.exporter.metadata import RAGGED_DOMAIN, write_recipe_ir

if TYPE_CHECKING:
    import onnx_ir as ir

    from raggedvit.pruning import PrunedViT

__all__ = ["IR_VERSION", "export_recipe", "write_header"]

IR_VERSION = 10  # onnxruntime 1.31 rejects IR 14


def export_recipe(
    recipe: dict[str, Any] | None,
    model: PrunedViT,
    *,
    dtype: str,
    img_size: int,
    outputs: list[str],
    block_outputs: list[str],
    stage_outputs: list[list[str]],
) -> dict[str, Any]:
    """The recipe of `model` (the traced PrunedViT, its spec resolved) exported in recipe `dtype`: `recipe` (local
    paths scrubbed) plus "prune", "capacity", "ragged_linear" (True or "dead-rows"; only when on, so default exports
    are unchanged), "dtype", the sizes, the graph's "outputs", the tensor names "block_outputs" and "stage_outputs"
    (naming.name_traced_outputs) and "raggedvit_version"."""
    mode = model.ragged_linear
    return {
        **scrub_paths(recipe or {}),
        "prune": model.spec.to_dict(),
        "capacity": model.capacity,
        **({"ragged_linear": True if mode == "all" else mode} if mode is not None else {}),
        "dtype": dtype,
        "img_size": img_size,
        "num_prefix_tokens": model.num_prefix,
        "tokens_per_image": model.backbone.tokens_per_image(),
        "depth": model.backbone.depth,
        "outputs": outputs,
        "block_outputs": block_outputs,
        "stage_outputs": stage_outputs,
        "raggedvit_version": raggedvit.__version__,
    }


def write_header(model: ir.Model, recipe: dict[str, Any]) -> None:
    """Set `model`'s IR version, the com.raggedvit opset, producer and doc_string, and store `recipe` (in place)."""
    model.ir_version = IR_VERSION
    model.opset_imports.setdefault(RAGGED_DOMAIN, 1)
    model.producer_name = PRODUCER_NAME
    model.producer_version = raggedvit.__version__
    model.doc_string = doc_string()  # the op library it needs and how to register it
    write_recipe_ir(model, recipe)
