"""The structural check: the export's numeric attributes against the reference's modules, block by block."""

from __future__ import annotations

import copy

import onnx_ir as ir
import pytest
import torch
from timm.layers import RmsNorm
from timm.models.vision_transformer import VisionTransformer

from raggedvit.exporter import build_model, read_recipe
from raggedvit.pruning import PruneSpec
from raggedvit.validators.structure import check_structure

SPEC = PruneSpec("topk-l2", (1,), keep=0.5)


def _vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    args = {"img_size": 64, "patch_size": 16, "embed_dim": 64, "depth": 2, "num_heads": 2, **kwargs}
    return VisionTransformer(**args).eval()


def _check(ref, exported, dtype="fp32", *, block_outputs=True):
    model = ir.to_proto(build_model(exported, SPEC, dtype=dtype))
    names = read_recipe(model)["block_outputs"] if block_outputs else None
    return check_structure(model, ref, names)


@pytest.fixture(scope="module")
def rich():
    """RmsNorm (torch.onnx decomposes it: the epsilon is an Add's constant), qk-norm, LayerScale, tanh GELU."""
    return _vit(norm_layer=RmsNorm, qk_norm=True, init_values=0.1, act_layer="gelu_tanh")


@pytest.mark.parametrize("dtype", ["fp32", "fp16-all"])
def test_a_clean_export_matches(rich, dtype):
    report = _check(rich, rich, dtype)
    assert not report.mismatches, [c.text() for c in report.mismatches]
    counts = report.counts()
    assert counts["norm epsilon"] == 3 and counts["LayerScale"] == 4  # blocks 0, 1 and the head; ls1, ls2 x 2
    assert counts["attention heads"] == counts["attention scale"] == counts["GELU"] == 2
    assert counts["patch size"] == counts["patch stride"] == 1
    assert report.summary().endswith(": all match") and not report.notes


def _eps(vit):
    for m in vit.modules():
        if isinstance(m, RmsNorm):
            m.eps = 1e-5


def _gelu(vit):
    for blk in vit.blocks:
        blk.mlp.act = torch.nn.GELU()


def _heads(vit):
    for blk in vit.blocks:
        blk.attn.num_heads, blk.attn.head_dim = 4, 16


def _layer_scale(vit):
    vit.blocks[1].ls2 = torch.nn.Identity()


def _scale(vit):
    vit.blocks[1].attn.scale *= 1.1


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_eps, ["block 0: norm epsilon 1e-05 in the export, 1e-06 in the reference", "block 1: norm epsilon 1e-05",
                "the head: norm epsilon 1e-05"]),
        (_gelu, ["block 0: GELU erf in the export, tanh in the reference", "block 1: GELU erf"]),
        (_layer_scale, ["block 1: LayerScale blocks.1.ls2.gamma [64] of the reference: no Mul by it in the export"]),
        (_scale, ["block 1: attention scale 0.194454 in the export, 0.177 in the reference"]),
    ],
    ids=["rmsnorm-eps", "gelu-flavour", "layerscale", "scale"],
)  # fmt: skip
def test_a_mismatch_names_the_block_and_the_attribute(rich, mutate, expected):
    bad = copy.deepcopy(rich)
    mutate(bad)
    texts = [c.text() for c in _check(rich, bad, "fp16").mismatches]
    assert len(texts) == len(expected) and all(t.startswith(e) for t, e in zip(texts, expected)), texts


def test_head_count():
    vit = _vit()
    bad = copy.deepcopy(vit)
    _heads(bad)
    texts = [c.text() for c in _check(vit, bad).mismatches]
    assert texts == [f"block {b}: attention heads 4 in the export, 2 in the reference" for b in (0, 1)]


def test_patch_size_and_stride():
    report = _check(_vit(), _vit(patch_size=8))
    texts = [c.text() for c in report.mismatches]
    assert "the patch embedding: patch size 8 in the export, 16 in the reference" in texts
    assert "the patch embedding: patch stride 8 in the export, 16 in the reference" in texts


def test_without_block_outputs_the_whole_model_is_compared(rich):
    """Exports whose recipe names no block outputs: every node against every module of the model."""
    assert not _check(rich, rich, block_outputs=False).mismatches
    bad = copy.deepcopy(rich)
    _eps(bad)
    report = _check(rich, bad, block_outputs=False)
    assert [c.text() for c in report.mismatches] == [
        "the model: norm epsilon 1e-05 in the export, 1e-06 in the reference"
    ]
    assert "the recipe names no block outputs" in report.notes[0]


def test_an_omitted_attention_scale_is_the_ops_default(rich):
    """RaggedAttention's scale is optional (default 1/sqrt(D), D from the qkv width): an export without it matches
    a model whose attention scale is that default, and not one whose scale is another."""
    model = ir.to_proto(build_model(rich, SPEC))
    for node in model.graph.node:
        if node.op_type == "RaggedAttention":
            kept = [a for a in node.attribute if a.name != "scale"]
            del node.attribute[:]
            node.attribute.extend(kept)
    names = read_recipe(model)["block_outputs"]
    assert not check_structure(model, rich, names).mismatches
    other = copy.deepcopy(rich)
    _scale(other)
    assert [c.text()[:24] for c in check_structure(model, other, names).mismatches] == ["block 1: attention scale"]


def test_a_merge_averages_over_the_blocks_heads():
    """tome: each block's RaggedMerge averages its keys over the block's attention heads; a node told another head
    count is named."""
    vit = _vit()
    model = ir.to_proto(build_model(vit, PruneSpec("tome", r=2)))
    names = read_recipe(model)["block_outputs"]
    report = check_structure(model, vit, names)
    assert not report.mismatches and report.counts()["merge heads"] == 2
    for node in model.graph.node:
        if node.op_type == "RaggedMerge":
            next(a for a in node.attribute if a.name == "num_heads").i = 4
    texts = [c.text() for c in check_structure(model, vit, names).mismatches]
    assert texts == [f"block {b}: merge heads 4 in the export, 2 in the reference" for b in (0, 1)], texts
