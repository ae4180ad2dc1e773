"""Graph rewrites on the traced model: the fusions ONNX Runtime does not find by itself in a traced ViT.

One module per rule family (`passes`, `embedding`, `gelu`, `layer_norm`, `merge`, `index`), each rule small, named and
tested on its own (tests/exporter/rules/). `PIPELINE` is the order `fuse_for_ort` applies them in, one `Step` per
pass or rule set with the reason it runs where it does (DESIGN.md section 5). Rule sets run one after another: every
match of a set is rewritten before the next set looks at the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir
from onnx_ir.passes import common
from onnxscript.rewriter import pattern, rewrite

from raggedvit.exporter.rules.embedding import PatchBiasIntoPosition, PatchEmbed
from raggedvit.exporter.rules.gelu import BiasGelu, ZeroBiasGelu
from raggedvit.exporter.rules.index import FlatReshape, Gather1d
from raggedvit.exporter.rules.layer_norm import (
    GatherLayerNorm,
    LayerNormRows,
    PlainSkipLayerNorm,
    RaggedLinearSkipLayerNorm,
    SkipLayerNorm,
)
from raggedvit.exporter.rules.merge import merge_residual
from raggedvit.exporter.rules.passes import drop_unused_outputs, fold_weight_layout, gemm_to_matmul

__all__ = ["PIPELINE", "Step", "fuse_for_ort", "rule_names", "untyped_values"]


@dataclass(frozen=True)
class Step:
    """One step of `fuse_for_ort`: a whole-graph pass (`run`, changing the model in place) or a rule set (`rules`),
    and why it runs at this point of the order."""

    name: str
    reason: str
    rules: pattern.RewriteRuleSet | None = None
    run: Callable[[ir.Model], int] | None = None

    def apply(self, model: ir.Model) -> ir.Model:
        if self.run is not None:
            self.run(model)
            return model
        return rewrite(model, pattern_rewrite_rules=self.rules)


def _rules(*rules: pattern.RewriteRule) -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet(list(rules))


PIPELINE: tuple[Step, ...] = (
    Step(
        "fold_weight_layout",
        "first: the patch weight's Reshape / Transpose become one constant, which patch_embed's pattern reads",
        run=fold_weight_layout,
    ),
    Step(
        "gemm_to_matmul",
        "before the rules: it writes the MatMul + Add(b) that bias_gelu and skip_layer_norm match",
        run=gemm_to_matmul,
    ),
    Step(
        "drop_unused_outputs",
        "independent of the rules; early so that no rule sees an unread cls_attn output",
        run=drop_unused_outputs,
    ),
    Step(
        "merge_residual",
        "after gemm_to_matmul, whose bias Add it folds with the residual Add into a RaggedMerge; no other rule "
        "matches these Adds (no LayerNormalization reads their sum)",
        run=merge_residual,
    ),
    Step(
        "patch_bias_into_position",
        "before patch_embed: it leaves the MatMul as the Concat's input, which patch_embed's pattern requires",
        rules=_rules(PatchBiasIntoPosition.rule("patch_bias_into_position")),
    ),
    Step(
        "patch_embed",
        "after the bias moved into the position table; it only touches the embedding",
        rules=_rules(PatchEmbed.rule("patch_embed")),
    ),
    Step(
        "bias_gelu",
        "before zero_bias_gelu, which would take every Gelu and leave the bias Add unfused",
        rules=_rules(*BiasGelu.rule("bias_gelu").commute()),
    ),
    Step(
        "zero_bias_gelu",
        "after bias_gelu: the Gelus left have no bias Add before them",
        rules=_rules(ZeroBiasGelu.rule("zero_bias_gelu")),
    ),
    Step(
        "skip_layer_norm",
        "before layer_norm_rows; the biased variants come first in the set, as skip_layer_norm_plain would also "
        "match their Add(residual, Add(y, b)) and leave the bias out",
        rules=_rules(
            *(
                SkipLayerNorm.rule(f"skip_layer_norm{'_cast' if cast else ''}", cast=cast, residual_first=first)
                for cast in (False, True)
                for first in (True, False)
            ),
            PlainSkipLayerNorm.rule("skip_layer_norm_plain"),
        ),
    ),
    Step(
        "ragged_linear_skip_layer_norm",
        "before layer_norm_rows, which would take its LayerNormalization without the live count",
        rules=_rules(RaggedLinearSkipLayerNorm.rule("ragged_linear_skip_layer_norm")),
    ),
    Step(
        "gather_layer_norm",
        "before layer_norm_rows, which would normalise the gathered rows and leave the Gather",
        rules=_rules(GatherLayerNorm.rule("gather_layer_norm")),
    ),
    Step(
        "layer_norm_rows",
        "last of the LayerNormalization rules: it takes every float16 row norm the rules above left",
        rules=_rules(LayerNormRows.rule("layer_norm_rows")),
    ),
    Step(
        "index",
        "independent of the fusions; last, on the graph the stages left",
        rules=_rules(FlatReshape.rule("flat_reshape"), Gather1d.rule("gather_1d")),
    ),
)


def rule_names() -> list[str]:
    """Every pass and rule name of `PIPELINE`, in order (a commuted rule once)."""
    names: list[str] = []
    for step in PIPELINE:
        for name in [step.name] if step.rules is None else [r.name for r in step.rules.rules]:
            if name not in names:
                names.append(name)
    return names


def untyped_values(model: ir.Model) -> list[str]:
    """'value (domain::Op node)' of every node output of the top-level graph with no element type recorded. An
    export has none: the CUDA placement check (exporter/placement.py) judges a node by the types the file records,
    and a node with an untyped input or output has a signature no placement table holds."""
    return [
        f"{v.name} ({node.domain or 'ai.onnx'}::{node.op_type} {node.name})"
        for node in model.graph
        for v in node.outputs
        if v.name and (v.type is None or v.dtype is None)
    ]


def fuse_for_ort(model: ir.Model) -> ir.Model:
    """The steps of `PIPELINE` in order, then dead nodes and initializers dropped. A value a rule or pass creates has
    its element type set (the rules' dtype checks read it; build_model refuses an export with an untyped value:
    untyped_values)."""
    for step in PIPELINE:
        model = step.apply(model)
    for cleanup in (
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
        common.RemoveUnusedOpsetsPass(),
    ):
        model = cleanup(model).model
    return model
