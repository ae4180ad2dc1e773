"""Relative position bias in ragged attention: the index against timm's, the interpreted Triton kernels and the CPU
path against the float64 reference, out-of-range token positions, and timm's own attention math (BEiT, RelPosBias,
RelPosMlp) on a whole image and on a pruned subset of its tokens."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from _kernel_cases import check_against_reference, make_batch, poisoned_outputs, relpos_inputs
from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp
from timm.layers.pos_embed_rel import gen_relative_position_index as timm_layers_index
from timm.models.beit import Attention as BeitAttention
from timm.models.beit import gen_relative_position_index as timm_beit_index
from timm.models.vision_transformer_relpos import RelPosAttention

from raggedvit.kernels import ragged_attention
from raggedvit.kernels._launch import _launch_triton
from raggedvit.kernels.reference import pos_table_size, relative_position_index
from tests.support.testing import assert_close


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (4, 4), (14, 14), (7, 3)])
def test_index_is_timms(grid):
    """BEiT's index (one class token) and timm.layers' (with and without a class token), query minus key."""
    n = grid[0] * grid[1]
    with_cls = relative_position_index(torch.arange(n + 1), torch.arange(n + 1), grid, 1)
    assert torch.equal(with_cls, timm_beit_index(grid))
    assert torch.equal(with_cls, timm_layers_index(grid, class_token=True))
    assert torch.equal(relative_position_index(torch.arange(n), torch.arange(n), grid, 0), timm_layers_index(grid))
    assert int(with_cls.max()) == pos_table_size(grid) - 1


def test_index_of_odd_positions_is_the_class_entry():
    """-1 (an evit fused token), other prefix tokens and values past the grid are class rows; never out of range."""
    grid, p = (2, 3), 2
    R = pos_table_size(grid)
    t = torch.tensor([-1, 0, 1, 2, 7, 8, 2**40, -(2**40)])
    idx = relative_position_index(t, t, grid, p)
    patch = torch.tensor([False, False, False, True, True, False, False, False])
    assert torch.equal(idx[~patch][:, ~patch], torch.full((6, 6), R - 1))
    assert (idx[~patch][:, patch] == R - 3).all() and (idx[patch][:, ~patch] == R - 2).all()
    assert int(idx[3, 4]) == (0 - 1 + 1) * 5 + (0 - 2 + 2)  # (y, x) = (0, 0) and (1, 2)


# (dtype, D, H, grid, num_prefix, lengths): every dtype; straddling tiles, a single row, p = 0 and 2
CASES = [
    (torch.float16, 64, 3, (4, 5), 1, [21, 7, 1, 15]),
    (torch.bfloat16, 32, 2, (3, 3), 0, [9, 4, 9]),
    (torch.float32, 32, 1, (6, 7), 2, [44, 3, 30]),
    (torch.float16, 32, 12, (2, 2), 1, [5, 5, 2, 70]),  # longer than p + area: repeated patch positions
]


@pytest.mark.parametrize(("dtype", "D", "H", "grid", "p", "lengths"), CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
def test_kernels_match_reference(interpreted, gen, dtype, D, H, grid, p, lengths, cu_dtype):
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype)
    pos = relpos_inputs(lengths, H, grid, p, gen, cu_dtype=cu_dtype, odd_rows=3)
    out, cls_attn = poisoned_outputs(qkv, H)
    _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, out=out, cls_attn=cls_attn, **pos)
    check_against_reference(out, cls_attn, qkv, cu, H, pos=pos, name="triton")
    out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True, **pos)
    check_against_reference(out, cls_attn, qkv, cu, H, pos=pos, name="cpu")


def test_bias_and_pos_together(interpreted, gen):
    H, D = 2, 32
    qkv, cu = make_batch([10, 3], H, D, torch.float32, gen)
    pos = relpos_inputs([10, 3], H, (3, 3), 1, gen)
    bias = torch.randn(3 * H * D, generator=gen)
    want = ragged_attention(qkv + bias, cu, H, return_cls_attn=True, **pos)
    got = _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, bias=bias, **pos)
    for g, w, name in zip(got, want, ("out", "cls_attn")):
        assert_close(g, w, name=name)
    for g, w, name in zip(ragged_attention(qkv, cu, H, return_cls_attn=True, bias=bias, **pos), want, ("o", "c")):
        assert_close(g, w, name=name)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
def test_any_token_pos_reads_inside_the_table(interpreted, gen, cu_dtype):
    """Every token_pos value (negative, past the grid, the dtype's extremes) reads the table in bounds: the table
    sits between NaN guards, so an out-of-range read would turn the outputs into NaN."""
    H, D, grid = 2, 32, (3, 4)
    R = pos_table_size(grid)
    qkv, cu = make_batch([40, 24], H, D, torch.float16, gen, cu_dtype=cu_dtype)
    pos = relpos_inputs([40, 24], H, grid, 1, gen, cu_dtype=cu_dtype, odd_rows=30)
    guarded = torch.full((H * R + 64,), float("nan"))
    guarded[32 : 32 + H * R] = pos["pos_table"].flatten()
    pos["pos_table"] = guarded[32 : 32 + H * R].view(H, R)
    out, cls_attn = _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, **pos)
    check_against_reference(out, cls_attn, qkv, cu, H, pos=pos)


def test_opcheck_and_export_schema(gen):
    H = 2
    qkv, cu = make_batch([5, 1, 9], H, 16, torch.float32, gen, cu_dtype=torch.int64)
    pos = relpos_inputs([5, 1, 9], H, (2, 3), 1, gen, cu_dtype=torch.int64)
    args = (pos["pos_table"], pos["token_pos"], 2, 3, 1)
    for cls in (True, False):
        torch.library.opcheck(torch.ops.raggedvit.ragged_attention.default, (qkv, cu, None, H, 0.25, cls, *args))
    out = torch.ops.raggedvit.ragged_attention(qkv, cu, None, H, 0.25, False, *args)[0]
    assert_close(out, ragged_attention(qkv, cu, H, scale=0.25, **pos), name="op")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"grid": None}, "go together"),
        ({"token_pos": None}, "go together"),
        ({"grid": (0, 3)}, "grid must be two ints >= 1"),
        ({"num_prefix": -1}, "num_prefix >= 0"),
        ({"pos_table": torch.zeros(2, 39)}, r"pos_table must be \[num_heads, \(2\*grid_h-1\)\*\(2\*grid_w-1\)\+3\]"),
        ({"pos_table": torch.zeros(2, 38, dtype=torch.float64)}, "float32"),
        ({"token_pos": torch.zeros(4, dtype=torch.int64)}, r"token_pos must be \[6\] torch.int32"),
        ({"token_pos": torch.zeros(6, dtype=torch.int64)}, "cu_seqlens's dtype"),
    ],
)
def test_bad_pos_inputs_raise(change, match):
    qkv = torch.zeros(6, 3 * 2 * 8)
    kw = {"pos_table": torch.zeros(2, 38), "token_pos": torch.zeros(6, dtype=torch.int32), "grid": (3, 4)}
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        ragged_attention(qkv, torch.tensor([0, 6], dtype=torch.int32), 2, **kw)


# timm's attention math: the op (fed with the block's qkv) + proj == the timm attention module, on a whole image,
# and on a pruned subset (original token indices kept) == the dense attention restricted to the kept rows/keys.

GRID, DIM, HEADS = (3, 4), 64, 4


def _beit() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, int]:
    """BEiT attention (q/v bias, one class token) with a random table: (module, qkv bias, pos_table [H, R], p)."""
    attn = BeitAttention(DIM, HEADS, qkv_bias=True, window_size=GRID).eval()
    with torch.no_grad():
        attn.relative_position_bias_table.normal_(0, 1)
        attn.q_bias.normal_(0, 0.5)
        attn.v_bias.normal_(0, 0.5)
    bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)).detach()
    return attn, bias, attn.relative_position_bias_table.detach().T.contiguous(), 1


def _relpos_bias() -> tuple[torch.nn.Module, torch.Tensor | None, torch.Tensor, int]:
    """vision_transformer_relpos with RelPosBias and a class token: its table has its own 3 class entries."""
    attn = RelPosAttention(
        DIM, HEADS, qkv_bias=True, rel_pos_cls=partial(RelPosBias, window_size=GRID, prefix_tokens=1)
    )
    with torch.no_grad():
        attn.rel_pos.relative_position_bias_table.normal_(0, 1)
    return attn.eval(), attn.qkv.bias.detach(), attn.rel_pos.relative_position_bias_table.detach().T.contiguous(), 1


def _relpos_mlp(mode: str, prefix: int) -> tuple[torch.nn.Module, torch.Tensor | None, torch.Tensor, int]:
    """RelPosMlp: the table is the MLP over the (2h-1)(2w-1) log coords (16*sigmoid in 'swin' mode), evaluated once;
    timm pads the prefix rows/columns of the bias with zeros, so the 3 class entries are 0."""
    rel = partial(RelPosMlp, window_size=GRID, prefix_tokens=prefix, mode=mode)
    attn = RelPosAttention(DIM, HEADS, qkv_bias=False, rel_pos_cls=rel).eval()
    m = attn.rel_pos
    with torch.no_grad():
        t = m.mlp(m.rel_coords_log).reshape(-1, HEADS)  # [(2h-1)(2w-1), H]
        t = m.bias_act(t) * (m.bias_gain or 1.0)
    return attn, None, torch.cat([t.T, torch.zeros(HEADS, 3)], 1).contiguous(), prefix


MODELS = {
    "beit": _beit,
    "relpos-bias": _relpos_bias,
    "relpos-mlp-swin": partial(_relpos_mlp, "swin", 1),
    "relpos-mlp-cr-no-cls": partial(_relpos_mlp, "cr", 0),
}


def _dense_bias(attn: torch.nn.Module) -> torch.Tensor:
    """timm's [H, N, N] bias of the whole image, built by its own module."""
    if isinstance(attn, BeitAttention):
        return attn._get_rel_pos_bias()[0]
    return attn.rel_pos.get_bias()[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_op_equals_timm_attention(gen, interpreted, name):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    attn, qkv_bias, table, p = MODELS[name]()
    N = GRID[0] * GRID[1] + p
    x = torch.randn(2, N, DIM, generator=gen)
    with torch.no_grad():
        want = attn(x)  # [2, N, C]: timm's attention (SDPA with its bias), proj included
        qkv = F.linear(x, attn.qkv.weight, qkv_bias).reshape(2 * N, 3 * DIM)
        cu = torch.tensor([0, N, 2 * N])
        tp = torch.arange(N).repeat(2)
        pos = {"pos_table": table, "token_pos": tp, "grid": GRID, "num_prefix": p}
        out = ragged_attention(qkv, cu, HEADS, **pos)
        assert_close(attn.proj(out).reshape(2, N, DIM), want, name=f"{name} cpu")
        out, _ = _launch_triton(qkv, cu, HEADS, attn.scale, False, kernels=interpreted, **pos)
        assert_close(attn.proj(out).reshape(2, N, DIM), want, name=f"{name} triton")

        # pruned: image 0 keeps its prefix and 7 patches in a shuffled order, image 1 keeps all; original indices
        keep = torch.cat([torch.arange(p), p + torch.randperm(N - p, generator=gen)[:7]])
        rows = torch.cat([keep, N + torch.arange(N)])
        tp = torch.cat([keep, torch.arange(N)])
        cu = torch.tensor([0, len(keep), len(keep) + N])
        pos = {"pos_table": table, "token_pos": tp, "grid": GRID, "num_prefix": p}
        got, got_cls = ragged_attention(qkv[rows], cu, HEADS, return_cls_attn=True, **pos)
        tri, tri_cls = _launch_triton(qkv[rows], cu, HEADS, attn.scale, True, kernels=interpreted, **pos)
        dense = _dense_bias(attn)  # [H, N, N]
        q, k, v = qkv.reshape(2, N, 3, HEADS, -1).permute(2, 0, 3, 1, 4)  # each [2, H, N, D]
        sub = keep.tolist()
        s = q[0][:, sub] @ k[0][:, sub].transpose(1, 2) * attn.scale + dense[:, sub][:, :, sub]  # [H, n, n]
        prob = s.softmax(-1)
        ref = (prob @ v[0][:, sub]).transpose(0, 1).reshape(len(sub), DIM)
        for o, c, impl in ((got, got_cls, "cpu"), (tri, tri_cls, "triton")):
            assert_close(o[: len(sub)], ref, name=f"{name} {impl} pruned out")
            assert_close(c[: len(sub)], prob[:, 0].mean(0), name=f"{name} {impl} pruned cls_attn")
            assert_close(attn.proj(o[len(sub) :]), want[1], name=f"{name} {impl} unpruned image")


class _PrunedRelPos(torch.nn.Module):
    """Keeps the rows where keep is set (data-dependent T); their original indices are the token positions."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = keep.nonzero().squeeze(1)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), keep.sum().reshape(1)])
        pos = {"pos_table": self.table, "token_pos": rows, "grid": (3, 3), "num_prefix": 1}
        return ragged_attention(x[rows], cu, 2, return_cls_attn=True, **pos)


def test_export_with_data_dependent_rows(gen):
    table = torch.randn(2, pos_table_size((3, 3)), generator=gen)
    x = torch.randn(10, 3 * 2 * 16, generator=gen)
    keep = torch.tensor([1, 1, 0, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    ep = torch.export.export(_PrunedRelPos(table), (x, keep))
    node = next(n for n in ep.graph.nodes if n.target == torch.ops.raggedvit.ragged_attention.default)
    assert len(node.args) == 11  # the five position arguments are traced
    keep2 = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 1, 0], dtype=torch.bool)
    got = ep.module()(x, keep2)
    rows = keep2.nonzero().squeeze(1)
    want = ragged_attention(
        x[rows],
        torch.tensor([0, 4]),
        2,
        return_cls_attn=True,
        pos_table=table,
        token_pos=rows,
        grid=(3, 3),
        num_prefix=1,
    )
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
