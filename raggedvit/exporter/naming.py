"""The names of an export's tensors: its graph outputs (output_names), and the tensors the validator reads that stay
inside the graph: each block's output rows (block_output_name) and each stage's src and cu_seqlens
(stage_output_names). build_model traces all of them as outputs (traced_output_names), then unmarks the inner ones
(name_traced_outputs). Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir
    from torch import nn

    from raggedvit.pruning import PruneSpec

__all__ = [
    "block_output_name",
    "name_traced_outputs",
    "output_names",
    "stage_output_names",
    "traced_output_names",
    "unmark_outputs",
]


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


def traced_output_names(outputs: list[str], stages: int, depth: int) -> list[str]:
    """The output names to trace with: the graph outputs `outputs`, each stage's src and cu_seqlens, then a
    placeholder per block (its output rows)."""
    return outputs + [n for s in range(stages) for n in stage_output_names(s)] + [f"block_{b}" for b in range(depth)]


def unmark_outputs(model: ir.Model, names: list[str]) -> list[ir.Value]:
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


def name_traced_outputs(
    model: ir.Model, outputs: list[str], stages: int, depth: int
) -> tuple[list[str], list[list[str]]]:
    """In a model traced with `traced_output_names`: unmark the block and stage tensors (unmark_outputs, blocks
    first) and name the graph outputs `outputs` (a graph output traced again keeps the output's name). Returns the
    block tensors' names and per stage its [src, cu_seqlens] names (recipe keys "block_outputs", "stage_outputs")."""
    block_values = unmark_outputs(model, [block_output_name(b) for b in range(depth)])
    stage_values = unmark_outputs(model, [n for s in range(stages) for n in stage_output_names(s)])
    for value, name in zip(model.graph.outputs, outputs):
        value.name = name
    block_names = [str(v.name) for v in block_values]
    stage_pairs = [[str(v.name) for v in stage_values[2 * s : 2 * s + 2]] for s in range(stages)]
    return block_names, stage_pairs
