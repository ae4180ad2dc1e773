"""The translation of raggedvit::ragged_attention with the relative position bias: RaggedAttention gets inputs 3 and 4
(bias left empty when absent) and the grid attributes; ONNX Runtime's CPU EP then equals the torch op."""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch
from onnx import helper

from raggedvit.exporter.translations import RAGGED_ATTENTION_SCHEMA, TRANSLATIONS
from raggedvit.kernels import ragged_attention
from raggedvit.kernels.reference import pos_table_size
from tests.support.testing import assert_close

H, D, GRID, P = 2, 8, (3, 4), 1


class _RelPosAttention(torch.nn.Module):
    def __init__(self, with_bias: bool, with_pos: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(H, pos_table_size(GRID), generator=g), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(3 * H * D, generator=g), requires_grad=False) if with_bias else None
        self.with_pos = with_pos

    def forward(self, qkv: torch.Tensor, cu: torch.Tensor, token_pos: torch.Tensor):
        pos = {"pos_table": self.table, "token_pos": token_pos, "grid": GRID, "num_prefix": P} if self.with_pos else {}
        return ragged_attention(qkv, cu, H, return_cls_attn=True, bias=self.bias, **pos)


# without pos the node keeps 3 inputs and no grid attributes: test_graph.py checks it on whole exports
@pytest.mark.parametrize(("with_bias", "with_pos"), [(False, True), (True, True)])
def test_export_runs_in_ort(ort_session, gen, with_bias, with_pos):
    module = _RelPosAttention(with_bias, with_pos)
    qkv = torch.randn(13, 3 * H * D, generator=gen)
    cu = torch.tensor([0, 9, 13])
    token_pos = torch.tensor([0, 1, 2, 5, 7, 8, 11, 12, 3, 0, 4, -1, 99])  # a pruned image, then odd positions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, (qkv, cu, token_pos), dynamo=True, custom_translation_table=TRANSLATIONS, opset_version=20,
            input_names=["qkv", "cu", "token_pos"], verbose=False,
        )  # fmt: skip
    model = program.model_proto
    (node,) = [n for n in model.graph.node if n.op_type == "RaggedAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if with_pos:
        assert len(node.input) == 5 and (node.input[2] != "") == with_bias and node.input[4] == "token_pos"
        assert (attrs["grid_h"], attrs["grid_w"], attrs["num_prefix"]) == (*GRID, P)
    else:  # the node of before: no position inputs, no grid attributes
        assert len(node.input) == 3 and not {"grid_h", "grid_w", "num_prefix"} & set(attrs)
        model.graph.input.remove(next(i for i in model.graph.input if i.name == "token_pos"))
    feeds = {"qkv": qkv.numpy(), "cu": cu.numpy()} | ({"token_pos": token_pos.numpy()} if with_pos else {})
    out, cls_attn = ort_session(model).run(None, feeds)
    want, want_cls = module(qkv, cu, token_pos)
    assert_close(torch.from_numpy(out), want, name="out")
    assert_close(torch.from_numpy(cls_attn), want_cls, name="cls_attn")


def test_schema_declares_the_position_inputs():
    names = [i.name for i in RAGGED_ATTENTION_SCHEMA.inputs]
    assert names == ["qkv", "cu_seqlens", "bias", "pos_table", "token_pos", "key_bias"]
    types = {i.name: i.type_str for i in RAGGED_ATTENTION_SCHEMA.inputs}
    assert types["token_pos"] == types["cu_seqlens"] and types["pos_table"] == "F"
    assert {"grid_h", "grid_w", "num_prefix"} <= set(RAGGED_ATTENTION_SCHEMA.attributes)
    assert onnx.defs.OpSchema.FormalParameterOption.Optional == RAGGED_ATTENTION_SCHEMA.inputs[3].option
