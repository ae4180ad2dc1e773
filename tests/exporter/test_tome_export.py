"""tome exports on ORT's CPU EP equal PrunedViT: logits (fp32: within 1e-5 relative), token counts, and per stage the
merged rows (their destination tokens), cu_seqlens and sizes exactly; one RaggedMerge node per merging block (no
scatter, static shapes); every batch size from one graph."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
import torch

from raggedvit.exporter import build_model
from raggedvit.exporter.checks import check_graph
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit, perturb_biases_and_norms_

from .conftest import to_proto

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)


@functools.cache
def _model(name: str, depth: int):
    vit, _ = load_vit(name, seed=1, img_size=224, model_kwargs={"depth": depth})
    return perturb_biases_and_norms_(vit).eval()


CASES = [
    ("deit_tiny_patch16_224", 3, PruneSpec("tome", r=8)),
    ("deit_tiny_patch16_224", 4, PruneSpec("tome", prune_at=(1, 3), r=30)),
    ("deit_tiny_distilled_patch16_224", 3, PruneSpec("tome", r=16)),
    ("vit_small_patch14_reg4_dinov2", 3, PruneSpec("tome", r=12)),  # registers, LayerScale
]


@pytest.mark.parametrize(
    ("name", "depth", "spec"), CASES, ids=["deit-r8", "deit-at1,3-r30", "distilled-r16", "reg4-r12"]
)
def test_export_equals_prunedvit(name, depth, spec, images, ort_session):
    vit = _model(name, depth)
    model = to_proto(build_model(vit, spec, diagnostics=True))
    assert check_graph(model) == []
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["NonZero"] == 0 and ops["ScatterND"] == 0 and ops["ScatterElements"] == 0, ops
    assert ops["RaggedMerge"] == len(spec.resolve(depth).prune_at), ops
    x = images[:3]
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, {"images": x.numpy()})))
    with torch.no_grad():
        ref = PrunedViT(vit, spec)(x)
    stages = len(ref.token_index)
    assert names[2:] == [f"{k}_{s}" for s in range(stages) for k in ("token_index", "cu_seqlens")] + [
        f"token_size_{s}" for s in range(stages)
    ]
    np.testing.assert_array_equal(got["token_counts"], ref.token_counts.numpy())
    for s in range(stages):
        np.testing.assert_array_equal(got[f"token_index_{s}"], ref.token_index[s].numpy())
        np.testing.assert_array_equal(got[f"cu_seqlens_{s}"], ref.cu_seqlens[s].numpy())
        np.testing.assert_array_equal(got[f"token_size_{s}"], ref.token_size[s].numpy())
    diff = np.abs(got[names[0]] - ref.logits.numpy()).max()  # logits (features for the headless DINOv2)
    assert diff < 1e-5 * max(1.0, float(ref.logits.abs().max())), diff
    # static shapes per batch, a symbolic batch in the graph: another batch size from the same session
    one = sess.run([names[0], "token_counts"], {"images": x[1:2].numpy()})
    np.testing.assert_array_equal(one[1], ref.token_counts.numpy()[1:2])
    assert np.abs(one[0] - ref.logits.numpy()[1:2]).max() < 1e-4 * max(1.0, float(ref.logits.abs().max()))


def test_fp16_all_export_runs(images, ort_session):
    """The fp16-all recipe traces and runs (the merge sums in float32, rounded once to the float16 stream); the
    logits near fp32's."""
    vit, spec = _model("deit_tiny_patch16_224", 3), PruneSpec("tome", r=8)
    logits, counts = ort_session(build_model(vit, spec, dtype="fp16-all")).run(
        ["logits", "token_counts"], {"images": images[:2].numpy()}
    )
    with torch.no_grad():
        ref = PrunedViT(vit, spec)(images[:2])
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    assert np.abs(logits - ref.logits.numpy()).max() < 0.05 * max(1.0, float(ref.logits.abs().max()))


@pytest.mark.parametrize("biased", [False, True], ids=["seeded", "biased"])
def test_deit_small_merge_costs_one_node_per_merging_block(biased):
    """deit_small, tome r = 8 in every block, fp16-all: at most the unpruned export's nodes + 1 per merging block (the
    budget: + 2; 126 against 117, 128 against 119 biased: the constant token_counts save 3), with the seeded weights'
    zero proj biases and with nonzero ones (any trained checkpoint). An unpruned block's
    SkipLayerNormalization holds the proj bias, the attention residual and norm2; a merging block has the RaggedMerge
    (which takes the residual and the bias: the exporter's merge_residual) and norm2's LayerNormalization. None of
    the traced merge's ops."""
    vit, _ = load_vit("deit_small_patch16_224", seed=1, img_size=224)
    if biased:
        perturb_biases_and_norms_(vit)
    counts = {}
    for spec in (PruneSpec("none"), PruneSpec("tome", r=8)):
        model = to_proto(build_model(vit.eval(), spec, dtype="fp16-all"))
        counts[spec.policy] = Counter(n.op_type for n in model.graph.node)
    tome, unpruned = counts["tome"], counts["none"]
    assert tome["RaggedMerge"] == 12
    assert sum(tome.values()) <= sum(unpruned.values()) + 12, (sum(tome.values()), sum(unpruned.values()))
    assert tome["TopK"] == tome["ArgMax"] == tome["GatherElements"] == tome["Log"] == 0, tome
