"""torch.ops.raggedvit.merge_tokens (pruning/merge_op.py): the op PrunedViT's tome stages call, its CPU kernel
(merge.merge_tokens_reference), its fake implementation (shapes only), its argument checks, and the widening of a
float16 qkv under a float32 stream (the fp16 recipe)."""

from __future__ import annotations

import pytest
import torch

from raggedvit.pruning.merge import merge_tokens_reference, merge_widths, merged_count
from raggedvit.pruning.merge_op import MergeKeys, merge_tokens, merge_tokens_op
from tests.support.merge_cases import MergeCase, make_merge_inputs


def _inputs():
    """x [51, 8], MergeKeys (qkv [51, 24], its bias, H = 2), size [51], cu: 3 images of 17 rows (the op tests' inputs:
    tests/support/merge_cases.py)."""
    t = make_merge_inputs(MergeCase("op", B=3, n=17, H=2, Dh=4, C=8, num_prefix=1, r=4))
    return t["x"], MergeKeys(t["qkv"], t["qkv_bias"], 2), t["size"], t["cu"]


@pytest.mark.parametrize(("p", "r", "class_token"), [(0, 3, False), (1, 4, True), (2, 100, True), (5, 2, False)])
def test_cpu_op_is_the_reference(p, r, class_token):
    x, keys, size, cu = _inputs()
    got = merge_tokens(x, keys, size, cu, p, r, class_token=class_token)
    ref = merge_tokens_reference(x, keys.qkv, keys.bias, size, cu, keys.num_heads, p, r, class_token)
    for name, g, w in zip(got._fields, got, ref):
        assert torch.equal(g, w), name
    n = 17
    m = n - merged_count(n, p, r)
    assert got.x.shape == (3 * m, 8) and torch.equal(got.cu, torch.arange(4) * m)
    assert got.score.shape == (3 * merge_widths(n, p)[0],)
    assert torch.equal(got.key_bias, torch.log(got.size))


def test_fake_shapes_match_the_kernel():
    x, keys, size, cu = _inputs()
    args = (x, keys.qkv, keys.bias, size, cu, keys.num_heads, 1, 4, True)
    torch.library.opcheck(merge_tokens_op, args, test_utils=("test_schema", "test_faketensor"))


def test_float16_qkv_under_a_float32_stream_is_widened_exactly():
    x, keys, size, cu = _inputs()
    half = MergeKeys(keys.qkv.half(), keys.bias.half(), keys.num_heads)
    got = merge_tokens(x, half, size, cu, 1, 4)
    wide = merge_tokens(x, MergeKeys(half.qkv.float(), half.bias.float(), 2), size, cu, 1, 4)
    for g, w in zip(got, wide):
        assert torch.equal(g, w)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(x=a["x"][:-1]), "not a multiple of the 3 images"),
        (lambda a: a.update(cu=a["cu"].int()), "cu must be 1-D [B+1] int64"),
        (lambda a: a.update(keys=MergeKeys(a["keys"].qkv[:, :-1], None, 2)), "qkv must be [T=51, 3*H*Dh]"),
        (lambda a: a.update(keys=MergeKeys(a["keys"].qkv, a["keys"].bias[:-1], 2)), "qkv_bias must be [24]"),
        (lambda a: a.update(size=a["size"].double()), "size must be [51] float32"),
        (lambda a: a.update(num_prefix=18), "need 0 <= num_prefix <= n = 17"),
        (lambda a: a.update(r=-1), "r >= 0"),
    ],
)
def test_bad_arguments_are_refused_naming_them(change, message):
    x, keys, size, cu = _inputs()
    args = {"x": x, "keys": keys, "size": size, "cu": cu, "num_prefix": 1, "r": 4}
    change(args)
    with pytest.raises(ValueError) as err:
        merge_tokens(**args)
    assert message in str(err.value)
