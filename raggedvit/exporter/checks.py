"""Structural checks of an exported graph: IR version, opsets, required/forbidden ops, I/O, metadata."""

from __future__ import annotations

import re
from collections import Counter

import onnx
from onnx import TensorProto

from raggedvit import policies
from raggedvit.exporter.metadata import RAGGED_DOMAIN, read_recipe

OPSET = 20  # default-domain opset of every export: ONNX Gelu (opset 20) lets the bias_gelu rule see one node

__all__ = ["FORBIDDEN_OPS", "MAX_IR_VERSION", "check_graph", "recipe_static_shapes", "static_shapes"]

MAX_IR_VERSION = 13  # onnxruntime 1.31 rejects IR 14
# Control flow, sequences and data-dependent host ops: each forces CPU placement or Memcpy on the CUDA EP.
# (Shape arithmetic on the batch size is allowed: a session with the batch fixed folds it into constants.)
FORBIDDEN_OPS = frozenset(
    {
        "Loop",
        "If",
        "Scan",
        "Unique",
        "NonMaxSuppression",
        "SequenceAt",
        "SequenceConstruct",
        "SplitToSequence",
        "ConcatFromSequence",
        "SequenceInsert",
        "Compress",
    }
)

# (domain, op) of each stage kind: general (data-dependent) stages; uniform and capacity stages without evit's fuse
# (the indices from one RaggedSelect node, then gathers); capacity stages with evit's fuse (torch ops, no NonZero)
_PRUNE_OPS = (("", "TopK"), ("", "NonZero"), ("", "CumSum"), ("", "ScatterElements"), ("", "Gather"))
_SELECT_PRUNE_OPS = ((RAGGED_DOMAIN, "RaggedSelect"), ("", "Gather"))
_CAPACITY_PRUNE_OPS = (("", "TopK"), ("", "CumSum"), ("", "ScatterElements"), ("", "Gather"))
# tome stages (pruning/merge.py): one RaggedMerge node per merging block (matching and sums), no scatter
_MERGE_OPS = ((RAGGED_DOMAIN, "RaggedMerge"),)


def static_shapes(prune: dict, capacity: bool = False) -> bool:
    """True when the graph has static shapes for a given batch, no NonZero, and can run as a CUDA graph: every
    pruning method in the capacity layout (the recipe's "capacity"), else when every stage keeps an export-time-known
    count (topk-l2, evit without fuse)."""
    prune = prune or {}
    return policies.static_shapes(str(prune.get("policy", "none")), bool(prune.get("fuse", False)), capacity)


def recipe_static_shapes(recipe: dict) -> bool:
    """static_shapes of an export's recipe (its pruning spec and layout)."""
    return static_shapes(recipe.get("prune", {}), bool(recipe.get("capacity", False)))


def _shape_symbols(model: onnx.ModelProto) -> set[str]:
    """The symbols in the graph's symbolic dimensions (e.g. "197*batch" -> batch; an unbacked "u0" from NonZero)."""
    values = list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    dims = (d.dim_param for vi in values for d in vi.type.tensor_type.shape.dim if d.dim_param)
    return {name for dim in dims for name in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", dim)}


def _elem_and_dims(vi: onnx.ValueInfoProto) -> tuple[int, list[str | int]]:
    t = vi.type.tensor_type
    return t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]


def check_graph(model: onnx.ModelProto) -> list[str]:
    """Problems found in `model` (empty list: the graph has the expected structure)."""
    problems: list[str] = []
    if model.ir_version > MAX_IR_VERSION:
        problems.append(f"IR version {model.ir_version} > {MAX_IR_VERSION} (onnxruntime 1.31 rejects it)")
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get("", opsets.get("ai.onnx")) != OPSET:
        problems.append(f"default opset is {opsets.get('')}, expected {OPSET}")
    if opsets.get(RAGGED_DOMAIN) != 1:
        problems.append(f"opset import {RAGGED_DOMAIN} v1 missing (got {opsets.get(RAGGED_DOMAIN)})")
    ops = Counter((n.domain, n.op_type) for n in model.graph.node)
    bad = sorted(op for (_, op) in ops if op in FORBIDDEN_OPS or op.startswith("Memcpy"))
    if bad:
        problems.append(f"forbidden (host round trip / control flow) ops present: {bad}")
    try:
        recipe = read_recipe(model)
    except (KeyError, ValueError) as e:  # none, or malformed
        problems.append(str(e))
        recipe = {}
    depth = recipe.get("depth")
    n_attn = ops[(RAGGED_DOMAIN, "RaggedAttention")]
    if depth is not None and n_attn != depth:
        problems.append(f"{n_attn} RaggedAttention nodes, expected depth = {depth}")
    mode = recipe.get("ragged_linear")
    if mode and not ops[(RAGGED_DOMAIN, "RaggedLinear")]:
        policy = str(recipe.get("prune", {}).get("policy", "none"))
        if mode != "dead-rows" or policies.has_dead_rows(policy, bool(recipe.get("capacity"))):
            problems.append(f"recipe has ragged_linear {mode!r} but the graph has no RaggedLinear node")
    stages = 0 if recipe.get("prune", {}).get("policy", "none") == "none" else len(recipe["prune"].get("prune_at", ()))
    static = recipe_static_shapes(recipe)
    if stages:
        prune = recipe.get("prune", {})
        uniform = policies.counts_known(str(prune.get("policy", "none")), bool(prune.get("fuse", False)))
        fuse = bool(prune.get("fuse", False))
        expected = (
            _MERGE_OPS
            if prune.get("policy") in policies.MERGE_POLICIES
            else _SELECT_PRUNE_OPS
            if uniform or (static and not fuse)
            else _CAPACITY_PRUNE_OPS
            if static
            else _PRUNE_OPS
        )
        missing = [op for (domain, op) in expected if ops[(domain, op)] == 0]
        if missing:
            problems.append(f"pruning ops missing: {missing}")
    if static and ops[("", "NonZero")]:
        problems.append("NonZero in a static-shape pruning graph (it syncs with the host; CUDA graphs impossible)")
    if static:
        free = sorted(_shape_symbols(model) - {"batch"})
        if free:
            problems.append(f"static-shape pruning graph has dimensions not fixed by the batch: {free}")
    ins = {vi.name: _elem_and_dims(vi) for vi in model.graph.input}
    outs = {vi.name: _elem_and_dims(vi) for vi in model.graph.output}
    if list(ins) != ["images"] or ins["images"][0] != TensorProto.FLOAT or ins["images"][1][:1] != ["batch"]:
        problems.append(f"inputs {ins}, expected images [batch, 3, S, S] float32")
    names = recipe.get("outputs", ["logits", "token_counts"])
    if list(outs) != list(names):
        problems.append(f"outputs {list(outs)}, expected {names}")
    first = outs.get(names[0], (None, []))
    if first[0] != TensorProto.FLOAT or first[1][:1] != ["batch"]:
        problems.append(f"output {names[0]} {first}, expected [batch, classes] float32")
    exp_counts = (TensorProto.INT64, ["batch", stages])
    if outs.get("token_counts") != exp_counts:
        problems.append(f"output token_counts {outs.get('token_counts')}, expected {exp_counts}")
    return problems
