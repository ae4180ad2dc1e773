"""LayerNormalization rules.

- `skip_layer_norm`: LayerNormalization(Add(residual, Add(y, b))) whose sum is also the next residual ->
  com.microsoft::SkipLayerNormalization(y, residual, gamma, beta, b) (outputs: normalised, sum; ONNX Runtime's
  SkipLayerNorm kernel is faster than its LayerNormalization kernel: docs/decisions.md); the `..._cast` variant
  takes a Cast between the GEMM and the residual (the fp16 recipe: float16 GEMM, float32 stream), with the bias
  added in float32; `skip_layer_norm_plain` fuses LayerNormalization(Add(a, b)) of two equally shaped [T, C] rows
  without a bias (a zero bias that torch.onnx's optimizer dropped, or LayerScale).
- `ragged_linear_skip_layer_norm`: LayerNormalization(RaggedLinear(x, W, b, residual, cu)) -> RaggedLinear(x, W, b,
  -, cu) + com.raggedvit::GatherLayerNorm(y, Range(0, T, 1), gamma, beta, Skip=residual, CuSeqlens=cu) (outputs:
  normalised, sum) for the rows its kernel takes (float16, D a multiple of 16 up to 4096): the residual leaves the
  GEMM's epilogue and the norm follows the live count like the GEMMs, so the capacity layout's dead rows past
  cu[B] are neither read nor written (ONNX Runtime's SkipLayerNorm runs over every row). Other rows (float32, other
  widths) get SkipLayerNormalization(y, residual). The normalised rows and the sum past cu[B] are dead
  (unspecified); their readers (the next RaggedLinear GEMMs and residuals, the next stage's gather, the head's
  rows) read live rows only (DESIGN.md section 4).
- `gather_layer_norm`: a pruning stage's LayerNormalization(Gather(x, i)) -> com.raggedvit::GatherLayerNorm(x, i,
  gamma, beta) (outputs: normalised, the gathered rows, the next residual), for the same float16 rows: one pass
  over the kept rows in place of the Gather and ONNX Runtime's LayerNormalization kernel. The block's residual Add
  before the Gather stays (ONNX Runtime fuses it into the GEMM, after copying the residual into the output);
  absorbing it through the op's Skip input is not done (docs/decisions.md). Validation is the same either way and
  without the op.
- `layer_norm_rows`: the other LayerNormalizations of such float16 [T, D] rows (fp16-all's first norm1, over every
  token) -> com.raggedvit::GatherLayerNorm(x, Range(0, T, 1), gamma, beta), the same math on the same rows (the
  identity index; its Sum output, a copy of x, is not read); T from Shape / Squeeze, which ONNX Runtime folds into
  an index initializer once the batch is fixed (the op is faster than ONNX Runtime's LayerNormalization kernel:
  docs/decisions.md). Not the rows of a RaggedMerge (a tome stage): their norm stays one LayerNormalization node,
  where the index would cost three (Shape, Squeeze, Range) in every merging block.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from raggedvit.exporter.rules._common import (
    MS,
    RAGGED,
    not_norm_kernel_rows,
    not_row_norm,
    rank,
    rank1_const,
    row_range,
    type_norm_stats,
    typed,
)

__all__ = ["GatherLayerNorm", "LayerNormRows", "PlainSkipLayerNorm", "RaggedLinearSkipLayerNorm", "SkipLayerNorm"]


class SkipLayerNorm(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, *, cast: bool, residual_first: bool) -> None:
        super().__init__(name)
        self._cast, self._residual_first = cast, residual_first

    def pattern(self, op, y, b, residual, gamma, beta):
        branch = op.Add(y, b)
        if self._cast:
            branch = op.Cast(branch, _allow_other_attributes=True, _outputs=["branch"])
        total = op.Add(residual, branch) if self._residual_first else op.Add(branch, residual)
        normed = op.LayerNormalization(total, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])
        return normed, total

    def check(self, context, y, b, residual, gamma, beta, ln, **_):
        ok = pattern.MatchResult()
        attrs = ln.producer().attributes
        if attrs.get_int("axis", -1) not in (-1, (residual.shape.rank() - 1) if residual.shape else -1):
            return ok.fail("LayerNormalization not over the last axis")
        if attrs.get_int("stash_type", 1) != 1:
            return ok.fail("stash_type != 1")
        if not (rank1_const(b) and rank1_const(gamma) and rank1_const(beta)):
            return ok.fail("bias / gamma / beta are not constant 1-D tensors")
        if residual.dtype != gamma.dtype or residual.dtype != beta.dtype:
            return ok.fail("residual and LayerNorm weights differ in dtype")
        return ok

    def rewrite(self, op, y, b, residual, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        if self._cast:  # the GEMM output joins the stream's dtype first; its bias is added in that dtype
            to = residual.dtype
            y = typed(op.Cast(y, to=to), to, y.shape)
            b = op.initializer(ir.tensor(b.const_value.numpy().astype(to.numpy())), name=f"{b.name}_{to.name}")
        normed, mean, inv_std, total = op.SkipLayerNormalization(
            y, residual, gamma, beta, b, epsilon=eps, _domain=MS, _outputs=4
        )
        type_norm_stats(mean, inv_std)
        return normed, total


class PlainSkipLayerNorm(pattern.RewriteRuleClassBase):
    def pattern(self, op, a, b, gamma, beta):
        total = op.Add(a, b)
        normed = op.LayerNormalization(total, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])
        return normed, total

    def check(self, context, a, b, gamma, beta, ln, **_):
        ok = pattern.MatchResult()
        attrs = ln.producer().attributes
        if attrs.get_int("axis", -1) not in (-1, 1) or attrs.get_int("stash_type", 1) != 1:
            return ok.fail("not a float32-stash LayerNormalization over the last axis")
        if a.const_value is not None or b.const_value is not None or rank(a) != 2 or rank(b) != 2:
            return ok.fail("not a sum of two [T, C] rows")
        if a.shape[1] != b.shape[1] or a.dtype != b.dtype or a.dtype != gamma.dtype:
            return ok.fail("the rows differ in width or dtype")
        if not (rank1_const(gamma) and rank1_const(beta)):
            return ok.fail("gamma / beta are not constant 1-D tensors")
        return ok

    def rewrite(self, op, a, b, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        normed, mean, inv_std, total = op.SkipLayerNormalization(a, b, gamma, beta, epsilon=eps, _domain=MS, _outputs=4)
        type_norm_stats(mean, inv_std)
        return normed, total


class RaggedLinearSkipLayerNorm(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, w, b, residual, cu, gamma, beta):
        y = op.RaggedLinear(x, w, b, residual, cu, _domain=RAGGED, _allow_other_attributes=True,
                            _outputs=["y"])  # fmt: skip
        normed = op.LayerNormalization(y, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])
        return normed, y  # y is also the next residual: an output of the pattern (replaced by the sum)

    def check(self, context, x, w, b, residual, cu, gamma, beta, y, ln, **_):
        ok = pattern.MatchResult()
        attrs = ln.producer().attributes
        if attrs.get_int("axis", -1) not in (-1, 1) or attrs.get_int("stash_type", 1) != 1:
            return ok.fail("not a float32-stash LayerNormalization over the last axis")
        if residual is None or residual.name == "" or y.producer().attributes.get_int("activation", 0) != 0:
            return ok.fail("no residual, or an activation before it")
        if rank(residual) != 2 or residual.dtype != gamma.dtype:
            return ok.fail("the residual is not [T, C] rows of the LayerNorm's dtype")
        if not (rank1_const(gamma) and rank1_const(beta)):
            return ok.fail("gamma / beta are not constant 1-D tensors")
        return ok

    def rewrite(self, op, x, w, b, residual, cu, gamma, beta, y, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        gemm = typed(op.RaggedLinear(x, w, b, None, cu, activation=0, _domain=RAGGED), y.dtype, y.shape)
        if not_norm_kernel_rows(residual, gamma, beta) is None:  # the residual has y's shape and dtype
            index = row_range(op, gemm, ln.name or y.name)
            normed, total = op.GatherLayerNorm(
                gemm, index, gamma, beta, residual, None, cu, epsilon=eps, _domain=RAGGED, _outputs=2
            )
            return normed, total
        normed, mean, inv_std, total = op.SkipLayerNormalization(
            gemm, residual, gamma, beta, epsilon=eps, _domain=MS, _outputs=4
        )
        type_norm_stats(mean, inv_std)
        return normed, total


class GatherLayerNorm(pattern.RewriteRuleClassBase):
    """LayerNormalization(Gather(x, i)) -> com.raggedvit::GatherLayerNorm(x, i, gamma, beta) (outputs: normalised,
    the gathered rows)."""

    def pattern(self, op, x, i, gamma, beta):
        gathered = op.Gather(x, i, _allow_other_attributes=True, _outputs=["g"])
        normed = op.LayerNormalization(gathered, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])
        return normed, gathered  # the gathered rows are the next residual too: an output of the pattern

    def check(self, context, x, i, gamma, beta, g, ln, **_):
        ok = pattern.MatchResult()
        if (why := not_row_norm(ln)) is not None:
            return ok.fail(why)
        if g.producer().attributes.get_int("axis", 0) != 0 or rank(i) != 1 or i.dtype != ir.DataType.INT64:
            return ok.fail("not a row gather by a 1-D int64 index")
        if (why := not_norm_kernel_rows(x, gamma, beta)) is not None:
            return ok.fail(why)
        return ok

    def rewrite(self, op, x, i, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        normed, gathered = op.GatherLayerNorm(x, i, gamma, beta, epsilon=eps, _domain=RAGGED, _outputs=2)
        return normed, gathered


class LayerNormRows(pattern.RewriteRuleClassBase):
    """LayerNormalization(x, gamma, beta) of float16 [T, D] rows -> com.raggedvit::GatherLayerNorm(x, Range(0, T, 1),
    gamma, beta) (the identity index: the same rows, the same math); its Sum output (a copy of x) is not read."""

    def pattern(self, op, x, gamma, beta):
        return op.LayerNormalization(x, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])

    def check(self, context, x, gamma, beta, ln, **_):
        ok = pattern.MatchResult()
        if (why := not_row_norm(ln)) is not None:
            return ok.fail(why)
        node = ln.producer()
        graph_outputs = set(node.graph.outputs) if node.graph is not None else set()
        if any(v.uses() or v in graph_outputs for v in node.outputs[1:]):
            return ok.fail("the mean / inverse std outputs are read")
        if (why := not_norm_kernel_rows(x, gamma, beta)) is not None:
            return ok.fail(why)
        src = x.producer()
        if src is not None and src.domain == RAGGED and src.op_type == "RaggedMerge":
            return ok.fail("rows of a RaggedMerge: one LayerNormalization node, not an index and a GatherLayerNorm")
        return ok

    def rewrite(self, op, x, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        index = row_range(op, x, ln.name or x.name)
        normed, copy = op.GatherLayerNorm(x, index, gamma, beta, epsilon=eps, _domain=RAGGED, _outputs=2)
        typed(copy, x.dtype, x.shape)
        return normed
