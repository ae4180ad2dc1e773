"""Capacity-layout exports (DESIGN.md section 4): static shapes for every policy (no NonZero, every dimension fixed
by the batch), ORT CPU EP equal to PrunedViT, kept tokens through the diagnostic outputs, validate() passes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from raggedvit.exporter import build_model, check_graph, read_recipe, save_model
from raggedvit.exporter.checks import recipe_static_shapes
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.validators import validate

from .conftest import to_proto

SPECS = [PruneSpec("cls-mass", (2, 4), mass=0.8), PruneSpec("evit", (2, 4), keep=0.6, fuse=True)]


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_capacity_export")


@pytest.fixture(scope="module", params=SPECS, ids=lambda s: s.policy + ("-fuse" if s.fuse else ""))
def capacity_export(request, deit_tiny_d6, tmp_path_factory):
    spec = request.param
    path = tmp_path_factory.mktemp("capacity") / "m.onnx"
    recipe = {"model": "deit_tiny_patch16_224", "weights": {"source": "seeded", "seed": 1}}
    save_model(build_model(deit_tiny_d6, spec, recipe=recipe, diagnostics=True, capacity=True), path)
    return spec, path


def test_graph_is_static(capacity_export):
    spec, path = capacity_export
    model = onnx.load(str(path))
    assert check_graph(model) == []  # includes: no NonZero, no dimension other than functions of the batch
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["NonZero"] == 0
    if spec.fuse:  # evit's fuse keeps the torch stage (cumsums and a scatter of distinct indices)
        assert ops["ScatterElements"] >= len(spec.prune_at) and ops["RaggedSelect"] == 0
    else:  # one RaggedSelect node per stage computes the indices
        assert ops["RaggedSelect"] == len(spec.prune_at)
        assert ops["ScatterElements"] == ops["CumSum"] == ops["TopK"] == 0
    recipe = read_recipe(model)
    assert recipe["capacity"] is True and recipe_static_shapes(recipe)
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    if spec.policy == "cls-mass":  # capacity B x 197 rows after every stage
        assert dims["token_index_0"] == dims["token_index_1"] == ["197*batch"]


def test_select_stage_node_count(deit_tiny_d6):
    """A cls-mass capacity stage exports as its RaggedSelect node, the gather of x and the counts (Slice, Slice,
    Sub, Unsqueeze for token_counts): a handful of nodes, where the torch index math was ~55."""
    sizes = {}
    for spec in (PruneSpec("none"), PruneSpec("cls-mass", (2, 4), mass=0.8)):
        model = to_proto(build_model(deit_tiny_d6, spec, capacity=True))
        sizes[spec.policy] = len(model.graph.node)
    per_stage = (sizes["cls-mass"] - sizes["none"]) / 2
    assert per_stage <= 8, sizes


def test_compact_export_of_cls_mass_is_not_static(deit_tiny_d6):
    model = to_proto(build_model(deit_tiny_d6, PruneSpec("cls-mass", (2,)), diagnostics=True))
    assert check_graph(model) == [] and not recipe_static_shapes(read_recipe(model))
    model.metadata_props[0].value = model.metadata_props[0].value.replace('"capacity": false', '"capacity": true')
    problems = check_graph(model)
    assert any("NonZero in a static-shape" in p for p in problems)
    assert any("not fixed by the batch: ['u0']" in p for p in problems), problems


def test_ort_cpu_equals_pruned_vit(capacity_export, deit_tiny_d6, images, ort_session):
    spec, path = capacity_export
    session = ort_session(str(path))
    for x in (images[:5], images[:1]):  # one file, any batch
        got = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            ref = PrunedViT(deit_tiny_d6, spec)(x)  # the compact layout
        assert float(np.abs(got[0] - ref.logits.numpy()).max()) < 1e-4
        np.testing.assert_array_equal(got[1], ref.token_counts.numpy())
        for s in range(spec.num_stages):
            index, cu = got[2 + 2 * s], got[3 + 2 * s]
            np.testing.assert_array_equal(cu, ref.cu_seqlens[s].numpy())
            np.testing.assert_array_equal(index[: int(cu[-1])], ref.token_index[s].numpy())


def test_validate_passes_with_kept_tokens(capacity_export, deit_tiny_d6, images):
    spec, path = capacity_export
    names = [f"photo{i}" for i in range(4)]
    report = validate(path, images[:4], names, vit=deit_tiny_d6, spec=spec, recipe=read_recipe(path))
    assert report.passed, report.to_markdown()
    assert report.counts_agreement == 1.0 and not any(r.token_swaps for r in report.rows)
