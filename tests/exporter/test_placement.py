"""The CUDA placement check on the CPU: every export kind's nodes have a CUDA EP kernel in the placement table, and
a node without one is named, with its op, types and why, by the check and by create_session's error. The same
exports keep their node and op counts (tests/data/export_counts.json: written before the policy registry replaced
the name tests, unchanged by it; evit's were recorded again when its stage moved inside its block, EViT's own
placement, with 3 nodes fewer, and 9 fewer with fuse: the fused token is no longer renormalised; relpos's fp16 and
fp16-all exports were recorded again when the MatMul before a bias got its type: their 2 BiasGelus of float16 rows are
com.raggedvit's, as bias_gelu intends, not com.microsoft's, which it chose while it read no dtype; and again when a
tome stage became one RaggedMerge node and the token_counts of stages with counts known before the data became
constants: tome 48-66 nodes where the traced merge took 261-279, uniform stages 4-11 fewer; and again when the
attention residual moved into RaggedMerge: tome 45-63). Every value of an
export has a recorded type: the check judges a node by the types the file records, and never guesses one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from raggedvit import runtime
from raggedvit.exporter import placement
from raggedvit.exporter.placement import PlacementTable, cuda_unplaced, node_signatures, placement_table
from raggedvit.validators import load_recipe
from raggedvit.validators.blocks import marked_model
from raggedvit.validators.mutants import BASE_SPEC, export_mutant, write_base_checkpoint
from tests.support.export_kinds import DTYPES, KINDS, export_kind

pytestmark = pytest.mark.slow
COUNTS = Path(__file__).resolve().parents[1] / "data" / "export_counts.json"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_export_kind_has_cuda_kernels_and_its_node_counts(kind: str, dtype: str, tmp_path) -> None:
    path = export_kind(kind, dtype, tmp_path)
    assert [str(u) for u in cuda_unplaced(path)] == []
    model = onnx.load(str(path), load_external_data=False)
    assert _untyped(model) == []
    ops = Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    want = json.loads(COUNTS.read_text())[f"{kind} {dtype}"]
    assert {"nodes": len(model.graph.node), "ops": dict(sorted(ops.items()))} == want


def _untyped(model: onnx.ModelProto) -> list[str]:
    """'node: signature' of every node with an input or output whose type the file does not record ('?')."""
    return [f"{node.name}: {sig}" for sig, node in node_signatures(model) if "?" in (*sig[3], *sig[4])]


@pytest.fixture(scope="module")
def trained_deit_tiny(tmp_path_factory):
    """(vit, recipe) of the mutation suite's base checkpoint: deit_tiny with a trained checkpoint's biases."""
    return write_base_checkpoint(tmp_path_factory.mktemp("base") / "base.pth")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_validation_export_of_a_trained_checkpoint_has_cuda_kernels_and_every_type(
    dtype: str, trained_deit_tiny, tmp_path
) -> None:
    """The mutation suite's control export (tests/validators/test_mutations.py `target`: deit_tiny, BASE_SPEC, the
    base checkpoint's recipe), and the copy that validate opens with its block and stage tensors marked as outputs.
    On an H100 the CUDA sessions of its fp16 and fp16-all exports were refused by name: the MatMul that
    gemm_to_matmul writes before a bias Add had no type, and once a rule fused the Add into SkipLayerNormalization
    or BiasGelu, their signatures had a '?' input that no table row matched. The export kinds had not shown it:
    timm's initial Linear biases are zero, torch.onnx drops them, and no bias Add is left to fuse."""
    vit, recipe = trained_deit_tiny
    path = export_mutant(None, vit, BASE_SPEC, recipe, tmp_path / "control.onnx", dtype=dtype)
    stored = load_recipe(path)
    names = stored["block_outputs"] + [n for pair in stored["stage_outputs"] for n in pair]
    for model in (onnx.load(str(path)), onnx.load_from_string(marked_model(path, names))):
        assert [str(u) for u in cuda_unplaced(model)] == []
        assert _untyped(model) == []


def test_an_export_with_an_untyped_value_is_refused(monkeypatch, tmp_path) -> None:
    from raggedvit.exporter import export

    fuse = export.fuse_for_ort

    def untype_a_matmul(model):
        model = fuse(model)
        next(n for n in model.graph if n.op_type == "MatMul").outputs[0].type = None
        return model

    monkeypatch.setattr(export, "fuse_for_ort", untype_a_matmul)
    with pytest.raises(RuntimeError, match=r"the export left 1 value\(s\) without a type: \S+ \(ai.onnx::MatMul "):
        export_kind("topk-l2", "fp32", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_table_names_its_source_and_covers_every_op_of_the_exports() -> None:
    table = placement_table()
    assert "OperatorKernels.md" in table.source or "onnxruntime-gpu" in table.source
    ops = {sig[1] for sig in table.cuda}
    assert len(table.cuda) >= 76 and ops >= {"TopK", "CumSum", "MatMul", "LayerNormalization", "SkipLayerNormalization"}


def _model(*nodes: onnx.NodeProto, x_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", x_type, [4])
    y = helper.make_tensor_value_info("y", x_type, [4])
    graph = helper.make_graph(list(nodes), "g", [x], [y])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.raggedvit", 1)], ir_version=10
    )


def _table(model: onnx.ModelProto, cuda: bool) -> PlacementTable:
    return PlacementTable("test", "9.9", {sig: cuda for sig, _ in node_signatures(model)})


def test_a_node_without_a_cuda_kernel_is_named() -> None:
    model = _model(helper.make_node("Relu", ["x"], ["y"], name="the_relu"))
    (u,) = cuda_unplaced(model, _table(model, cuda=False))
    assert u.node == "the_relu" and u.signature == ("", "Relu", 20, ("float",), ("float",))
    assert str(u) == (
        "the_relu (ai.onnx::Relu opset 20, inputs float -> float): the CUDA EP of onnxruntime 9.9 has no kernel "
        "for these types"
    )
    assert cuda_unplaced(model, _table(model, cuda=True)) == []
    (missing,) = cuda_unplaced(model, PlacementTable("test", "9.9", {}))
    assert "not in the placement table" in missing.reason and "ort_cuda_signatures.py" in missing.reason


def test_a_node_of_an_unrecorded_type_is_never_placed_by_a_guess() -> None:
    """A value with no recorded type ('?', here h: no value_info) leaves its readers and its producer unplaced, even
    where the table holds the '?' signature: which kernel runs depends on the type."""
    model = _model(helper.make_node("Relu", ["x"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["y"]))
    first, second = cuda_unplaced(model, _table(model, cuda=True))
    assert first.node == "first" and first.signature == ("", "Relu", 20, ("float",), ("?",))
    assert first.reason.startswith("the file records no type for its output 0: its CUDA kernel cannot be judged")
    assert second.node == "Relu -> y" and "records no type for its input 0" in second.reason
    ragged = _model(helper.make_node("BiasGelu", ["h", "x"], ["y"], domain="com.raggedvit"))
    (u,) = cuda_unplaced(ragged, _table(ragged, cuda=True))
    assert "records no type for its input 0" in u.reason
    # a raggedvit op is judged on every input and output too, not only on the inputs its CUDA types constrain
    gelu = helper.make_node("BiasGelu", ["x", "x"], ["h"], name="gelu", domain="com.raggedvit")
    ragged = _model(gelu, helper.make_node("Relu", ["h"], ["y"]), x_type=TensorProto.FLOAT16)
    first, _ = cuda_unplaced(ragged, _table(ragged, cuda=True))
    assert first.node == "gelu" and "records no type for its output 0" in first.reason


def test_raggedvit_ops_follow_the_op_library_cuda_types() -> None:
    model = _model(helper.make_node("BiasGelu", ["x", "x"], ["y"], name="gelu", domain="com.raggedvit"))
    (u,) = cuda_unplaced(model, _table(model, cuda=True))
    assert u.reason == "input 0 is float; the op library's CUDA kernel takes bfloat16 or float16"
    half = _model(helper.make_node("BiasGelu", ["x", "x"], ["y"], domain="com.raggedvit"), x_type=TensorProto.FLOAT16)
    assert cuda_unplaced(half, _table(half, cuda=True)) == []


def test_create_session_error_names_the_nodes(monkeypatch) -> None:
    model = _model(helper.make_node("Relu", ["x"], ["y"], name="the_relu"))
    monkeypatch.setattr(placement, "placement_table", lambda path=placement.DATA: _table(model, cuda=False))
    err = runtime._placement_error(model.SerializeToString(), RuntimeError("fallback to CPU EP has been disabled"))
    assert isinstance(err, runtime.CudaPlacementError) and [u.node for u in err.unplaced] == ["the_relu"]
    assert str(err).startswith("1 node(s) have no CUDA EP kernel (onnxruntime 9.9) and would run on the CPU EP")
    assert "the_relu (ai.onnx::Relu opset 20, inputs float -> float)" in str(err)
    monkeypatch.setattr(placement, "placement_table", lambda path=placement.DATA: _table(model, cuda=True))
    shapes = runtime._placement_error(model.SerializeToString(), RuntimeError("x"))
    assert shapes.unplaced == [] and "pass batch=N" in str(shapes)
