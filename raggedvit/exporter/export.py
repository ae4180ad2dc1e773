"""Pruned timm ViT -> ONNX by tracing PrunedViT (torch.export + torch.onnx), then named rewrite rules.

PrunedViT is the one definition of the pruned forward; this module only traces it with the dtype recipe
(raggedvit.pruning.precision), the translations of raggedvit's torch ops (translations.py) and the fusions ONNX
Runtime does not find by itself (rules/). The rest of an export has its own module: the tensors' names (naming.py),
the recipe and header (recipe.py), the RaggedLinear conditions (ragged_linear.py) and writing the file (saving.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch
from torch import nn

from raggedvit.exporter._registry import reused_torchlib_registry
from raggedvit.exporter.checks import OPSET
from raggedvit.exporter.naming import name_traced_outputs, output_names, traced_output_names
from raggedvit.exporter.ragged_linear import check_ragged_linear
from raggedvit.exporter.recipe import export_recipe, write_header
from raggedvit.exporter.rules import fuse_for_ort, untyped_values
from raggedvit.exporter.saving import save_model
from raggedvit.exporter.translations import TRANSLATIONS
from raggedvit.outputs import check_target
from raggedvit.pruning import PrunedViT, PruneSpec, build_pruned_vit
from raggedvit.pruning.packed import ragged_linear_mode
from raggedvit.pruning.precision import DTYPES, apply_dtype

__all__ = ["DTYPES", "OPSET", "build_model", "export_onnx"]

_MAX_BATCH = 1 << 16


class _Outputs(nn.Module):
    """PrunedViT with its outputs flattened to the graph outputs of `output_names`, then each stage's src and
    cu_seqlens, then (when the model collects them) each block's output rows: tensors the forward computes anyway,
    traced for their names and unmarked after tracing."""

    def __init__(self, model: PrunedViT, diagnostics: bool) -> None:
        super().__init__()
        self.model = model
        self.diagnostics = diagnostics

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(images)
        flat = [out.logits, out.token_counts]
        if self.diagnostics:
            for index, cu in zip(out.token_index, out.cu_seqlens):
                flat += [index, cu]
            flat += out.token_size
        for trace, cu in zip(out.stages, out.cu_seqlens):
            flat += [trace.src, cu]
        return (*flat, *out.blocks)


def build_model(
    vit: nn.Module,
    spec: PruneSpec,
    *,
    dtype: str = "fp32",
    recipe: dict[str, Any] | None = None,
    diagnostics: bool = False,
    capacity: bool = False,
    ragged_linear: bool | str = False,
) -> ir.Model:
    """The ONNX model (onnx_ir) of PrunedViT(vit, spec, capacity=capacity) in the export recipe `dtype`.

    Input: images [batch, 3, H, W] float32 (normalised). Outputs: see naming.output_names (with `capacity`, the
    diagnostic token_index_S has the stage's static capacity: only [0, cu_seqlens_S[batch]) are kept rows). The
    recipe dict (plus the prune spec, layout, dtype, sizes and version: recipe.export_recipe) is stored under the
    metadata key RECIPE_KEY. `capacity`: the capacity layout (DESIGN.md section 4): static shapes for every policy,
    so the graph runs as a CUDA graph (GraphRunner). `ragged_linear`: block GEMMs as com.raggedvit::RaggedLinear
    nodes, True / "all" in every block, "dead-rows" in the blocks with dead rows only (PrunedViT's `ragged_linear`;
    `check_ragged_linear` refusals), recipe key "ragged_linear" (True or "dead-rows"; only written when on, so
    default exports are unchanged).
    Recipe key "block_outputs": per block, the name of the tensor holding its output rows (naming.block_output_name;
    traced as outputs, then unmarked: the graph computes nothing more for them). Recipe key "stage_outputs": per
    stage, the names of its [src, cu_seqlens] tensors (naming.stage_output_names, likewise unmarked): the validator
    derives each image's kept tokens from them, with or without `diagnostics`.
    Every value of the model has its element type recorded: RuntimeError naming those without (a value a rewrite
    wrote untyped), as the CUDA placement check (exporter/placement.py) judges nodes by the file's types.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if ragged_linear_mode(ragged_linear) is not None:
        check_ragged_linear(vit, dtype)
    model = build_pruned_vit(  # checks model and spec
        apply_dtype(vit.float().eval(), dtype),
        spec,
        capacity=capacity,
        ragged_linear=ragged_linear,
        block_outputs=True,
    )
    h, w = (int(s) for s in vit.patch_embed.img_size)
    example = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=_MAX_BATCH)
    spec = model.spec  # resolved for the model (tome's every block made explicit)
    names = output_names(vit, spec, diagnostics=diagnostics)
    stages, depth = spec.num_stages, model.backbone.depth
    with torch.no_grad(), warnings.catch_warnings(), reused_torchlib_registry():
        warnings.simplefilter("ignore")  # torch.export's notes on the data-dependent counts (nonzero)
        program = torch.onnx.export(
            _Outputs(model, diagnostics),
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=traced_output_names(names, stages, depth),
            dynamic_shapes=({0: batch},),
            custom_translation_table=TRANSLATIONS,
            opset_version=OPSET,
            optimize=True,
            verbose=False,
        )
    ir_model = fuse_for_ort(program.model)
    if untyped := untyped_values(ir_model):
        more = f" and {len(untyped) - 5} more" if len(untyped) > 5 else ""
        raise RuntimeError(f"the export left {len(untyped)} value(s) without a type: {', '.join(untyped[:5])}{more}")
    block_names, stage_pairs = name_traced_outputs(ir_model, names, stages, depth)
    recipe = export_recipe(
        recipe, model, dtype=dtype, img_size=h, outputs=names, block_outputs=block_names, stage_outputs=stage_pairs
    )
    write_header(ir_model, recipe)
    return ir_model


def export_onnx(
    vit: nn.Module,
    spec: PruneSpec,
    path: str | Path,
    *,
    dtype: str = "fp32",
    recipe: dict[str, Any] | None = None,
    diagnostics: bool = False,
    capacity: bool = False,
    ragged_linear: bool | str = False,
) -> Path:
    """Trace, rewrite, check and write the pruned model to `path` (see build_model, save_model). OSError before the
    tracing when `path` cannot be written (check_target)."""
    check_target(path)
    model = build_model(
        vit,
        spec,
        dtype=dtype,
        recipe=recipe,
        diagnostics=diagnostics,
        capacity=capacity,
        ragged_linear=ragged_linear,
    )
    return save_model(model, path)
