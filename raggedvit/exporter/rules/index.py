"""Index clean-ups of torch.onnx's indexing translations (one node each, on every stage): `flat_reshape` drops
Reshape(x, [-1]) of a 1-D x; `gather_1d` turns GatherND(x, Unsqueeze(i, -1)) of a 1-D x into Gather(x, i)."""

from __future__ import annotations

from onnxscript.rewriter import pattern

from raggedvit.exporter.rules._common import const_ints, rank

__all__ = ["FlatReshape", "Gather1d"]


class FlatReshape(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _allow_other_attributes=True)

    def check(self, context, x, shape, **_):
        ok = pattern.MatchResult()
        if rank(x) != 1 or const_ints(shape) != [-1]:
            return ok.fail("not a flattening of a 1-D tensor")
        return ok

    def rewrite(self, op, x, shape, **_):
        return op.Identity(x)


class Gather1d(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, i, axes):
        return op.GatherND(x, op.Unsqueeze(i, axes), _allow_other_attributes=True, _outputs=["g"])

    def check(self, context, x, i, axes, g, **_):
        ok = pattern.MatchResult()
        if rank(x) != 1 or rank(i) is None or const_ints(axes) not in ([-1], [rank(i)]):
            return ok.fail("not a 1-D lookup")
        if g.producer().attributes.get_int("batch_dims", 0) != 0:
            return ok.fail("batch_dims != 0")
        return ok

    def rewrite(self, op, x, i, axes, **_):
        return op.Gather(x, i, axis=0)
