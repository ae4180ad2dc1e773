"""Pruned timm ViT -> ONNX by tracing PrunedViT (torch.export + torch.onnx), then named rewrite rules.

PrunedViT is the one definition of the pruned forward; this module only chooses the outputs, the dtype recipe
(raggedvit.pruning.precision), the translations of raggedvit's torch ops (translations.py) and the fusions
ONNX Runtime does not find by itself (rules/), and writes the recipe into the metadata.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import torch
from torch import nn

import raggedvit
from raggedvit.describe import PRODUCER_NAME, doc_string, scrub_paths
from raggedvit.exporter._registry import reused_torchlib_registry
from raggedvit.exporter.checks import OPSET
from raggedvit.exporter.files import external_data_name
from raggedvit.exporter.metadata import RAGGED_DOMAIN, write_recipe_ir
from raggedvit.exporter.rules import fuse_for_ort
from raggedvit.exporter.translations import TRANSLATIONS
from raggedvit.outputs import check_target, commit, open_file_mode, staging_dir
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.packed import ragged_linear_mode
from raggedvit.pruning.precision import DTYPES, apply_dtype

__all__ = [
    "DTYPES",
    "IR_VERSION",
    "OPSET",
    "block_output_name",
    "build_model",
    "check_ragged_linear",
    "export_onnx",
    "output_names",
    "save_model",
    "stage_output_names",
    "strip_local_metadata",
]

IR_VERSION = 10  # onnxruntime 1.31 rejects IR 14
EXTERNAL_DATA_BYTES = 1 << 30  # models with more initializer bytes keep their weights in a .data file beside them
_MAX_BATCH = 1 << 16


def output_names(vit: nn.Module, spec: PruneSpec, *, diagnostics: bool = False) -> list[str]:
    """The graph outputs: `logits` [batch, classes] (`features` [batch, C] for a headless model), `token_counts`
    [batch, stages]; with diagnostics, per stage s: `token_index_s` [T_s] and `cu_seqlens_s` [batch+1], then for
    tome per stage `token_size_s` [T_s] float32 (the tokens merged into each row). `spec`: resolved for the model
    (PruneSpec.resolve)."""
    first = "features" if int(getattr(vit, "num_classes", 1)) == 0 else "logits"
    names = [first, "token_counts"]
    if diagnostics:
        for s in range(spec.num_stages):
            names += [f"token_index_{s}", f"cu_seqlens_{s}"]
        if spec.merges:
            names += [f"token_size_{s}" for s in range(spec.num_stages)]
    return names


RAGGED_LINEAR_ALIGN = 16  # K and N of every RaggedLinear GEMM: the CUDA cubins are built for multiples of 16
RAGGED_LINEAR_DTYPES = ("fp16", "fp16-all")  # the CUDA EP's RaggedLinear has no float32 kernel


def check_ragged_linear(vit: nn.Module, dtype: str) -> None:
    """Raise ValueError (one line) unless `vit` exported in recipe `dtype` can use RaggedLinear nodes: a timm
    VisionTransformer (a backbone with supports_ragged_linear), an fp16 / fp16-all recipe, and every block GEMM's
    K and N (qkv, attn.proj, mlp.fc1, mlp.fc2) a multiple of RAGGED_LINEAR_ALIGN."""
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


def block_output_name(block: int) -> str:
    """Name of the tensor that holds block `block`'s output rows [T_b, C] in an exported graph (not a graph output:
    the validator marks it as one in a copy of the model, recipe key "block_outputs")."""
    return f"raggedvit.block_{block}_out"


def stage_output_names(stage: int) -> tuple[str, str]:
    """Names of the tensors that hold stage `stage`'s src [T_s] (StageTrace.src: the row before the stage that each
    row after it copies) and cu_seqlens [batch+1] in an exported graph (not graph outputs: the validator marks them
    in a copy and derives the kept tokens with pruning.kept_token_index; recipe key "stage_outputs"). A tensor that
    is a graph output already (cu_seqlens_S of a diagnostics export) keeps that name."""
    return f"raggedvit_stage_{stage}_src", f"raggedvit_stage_{stage}_cu_seqlens"


def _unmark(model: ir.Model, names: list[str]) -> list[ir.Value]:
    """Drop the last len(names) graph outputs (traced for their names only) and name the values they were (a value
    traced twice keeps its first name); the values stay, computed for the nodes that read them. Returns them."""
    values = list(model.graph.outputs[len(model.graph.outputs) - len(names) :])
    for _ in names:
        model.graph.outputs.pop()
    named: set[int] = set()
    for value, name in zip(values, names):
        if id(value) not in named:
            value.name = name
            named.add(id(value))
    return values


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

    Input: images [batch, 3, H, W] float32 (normalised). Outputs: see `output_names` (with `capacity`, the
    diagnostic token_index_S has the stage's static capacity: only [0, cu_seqlens_S[batch]) are kept rows). The
    recipe dict (plus the prune spec, layout, dtype, sizes and version) is stored under the metadata key
    RECIPE_KEY. `capacity`: the capacity layout (DESIGN.md section 4): static shapes for every policy, so the
    graph runs as a CUDA graph (GraphRunner). `ragged_linear`: block GEMMs as com.raggedvit::RaggedLinear nodes,
    True / "all" in every block, "dead-rows" in the blocks with dead rows only (PrunedViT's `ragged_linear`;
    `check_ragged_linear` refusals), recipe key "ragged_linear" (True or "dead-rows"; only written when on, so
    default exports are unchanged).
    Recipe key "block_outputs": per block, the name of the tensor holding its output rows (`block_output_name`;
    traced as outputs, then unmarked: the graph computes nothing more for them). Recipe key "stage_outputs": per
    stage, the names of its [src, cu_seqlens] tensors (`stage_output_names`, likewise unmarked): the validator
    derives each image's kept tokens from them, with or without `diagnostics`.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    mode = ragged_linear_mode(ragged_linear)
    if mode is not None:
        check_ragged_linear(vit, dtype)
    model = PrunedViT(  # checks model and spec
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
    depth = model.backbone.depth
    stage_names = [n for s in range(spec.num_stages) for n in stage_output_names(s)]
    traced = names + stage_names + [f"block_{bi}" for bi in range(depth)]
    with torch.no_grad(), warnings.catch_warnings(), reused_torchlib_registry():
        warnings.simplefilter("ignore")  # torch.export's notes on the data-dependent counts (nonzero)
        program = torch.onnx.export(
            _Outputs(model, diagnostics),
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=traced,
            dynamic_shapes=({0: batch},),
            custom_translation_table=TRANSLATIONS,
            opset_version=OPSET,
            optimize=True,
            verbose=False,
        )
    ir_model = fuse_for_ort(program.model)
    block_values = _unmark(ir_model, [block_output_name(bi) for bi in range(depth)])
    stage_values = _unmark(ir_model, stage_names)
    for value, name in zip(ir_model.graph.outputs, names):  # a graph output traced again keeps the output's name
        value.name = name
    block_names = [str(v.name) for v in block_values]
    stage_pairs = [[str(v.name) for v in stage_values[2 * s : 2 * s + 2]] for s in range(spec.num_stages)]
    ir_model.ir_version = IR_VERSION
    ir_model.opset_imports.setdefault(RAGGED_DOMAIN, 1)
    ir_model.producer_name = PRODUCER_NAME
    ir_model.producer_version = raggedvit.__version__
    ir_model.doc_string = doc_string()  # the op library it needs and how to register it
    full = {
        **scrub_paths(recipe or {}),
        "prune": spec.to_dict(),
        "capacity": bool(capacity),
        **({"ragged_linear": True if mode == "all" else mode} if mode is not None else {}),
        "dtype": dtype,
        "img_size": h,
        "num_prefix_tokens": model.num_prefix,
        "tokens_per_image": model.backbone.tokens_per_image(),
        "depth": model.backbone.depth,
        "outputs": names,
        "block_outputs": block_names,
        "stage_outputs": stage_pairs,
        "raggedvit_version": raggedvit.__version__,
    }
    write_recipe_ir(ir_model, full)
    return ir_model


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


def save_model(model: ir.Model, path: str | Path) -> Path:
    """Strip the exporting machine's metadata (strip_local_metadata, in place), check (onnx.checker, full) and write
    `model` to `path` atomically (staging_dir); weights over EXTERNAL_DATA_BYTES go to a data file beside it
    (files.external_data_name: `path`.data). The two are renamed into place as a pair (commit: one writer at a time
    per folder). Nothing is left at `path` (or beside it) if anything fails or a signal arrives."""
    path = Path(path)
    size = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    data_name = external_data_name(path) if size > EXTERNAL_DATA_BYTES else None
    with staging_dir(path.parent, path.name) as tmp:
        staged = tmp / path.name
        strip_local_metadata(model)
        ir.save(model, staged, external_data=data_name)
        onnx.checker.check_model(str(staged), full_check=True)
        mode = open_file_mode()
        for f in tmp.iterdir():
            os.chmod(f, mode)
        moves = {staged: path}
        if data_name is not None:
            moves = {tmp / data_name: path.parent / data_name, **moves}
        commit(moves)
    return path


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
