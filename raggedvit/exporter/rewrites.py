"""Graph rewrites on the traced model: the fusions ONNX Runtime does not find by itself in a traced ViT.

Each rule is small and named; `fuse_for_ort` applies them in order (DESIGN.md section 5):

0. `fold_weight_layout` (a pass, first): Reshape / Transpose of initializers (the patch embedding's
   proj.weight.reshape(C, -1).T, which torch.onnx writes as two nodes) become one initializer: the file holds the
   layout the MatMul reads (ONNX Runtime folds such nodes at session start; the file no longer relies on it).
1. `gemm_to_matmul` (a pass, not a pattern): torch.onnx writes a Linear as Gemm(x, W, b, transB=1); it becomes
   MatMul(x, W^T) with the weight transposed once in the file (+ Add(b)), the layout the builder-era graphs ran
   fastest with on the CUDA EP, and a bias Add the next rules can fuse.
2. `patch_bias_into_position`: Add(Concat(prefix, Add(y, b)), pos) -> Add(Concat(prefix, y), pos + b on the
   patch rows): the patch embedding's bias rides in the position table (ViT's embedding; ONNX Runtime otherwise
   runs the patch GEMM as a Gemm whose bias is first broadcast into the whole output: docs/decisions.md).
   `patch_embed` (next): Cast(Add(Concat(Expand(prefix)..., MatMul(im2col(images), W)), pos), float16) ->
   com.raggedvit::PatchEmbed(images, W in float16, prefix rows, pos, patch) when N is a multiple of 16: the fp16-all
   embedding as one kernel that reads the image once (in place of ONNX Runtime's float32 chain: Transpose / TF32
   MatMul / Concat / Add / Cast; docs/decisions.md); the pixels and W are rounded to float16 (the TF32 GEMM it
   replaces kept 10 bits of their mantissas too). The fp16 recipe (float32 stream) keeps the float32 chain.
   `bias_gelu`: Gelu(Add(y, b)) -> BiasGelu(y, b) (exact GELU); `zero_bias_gelu`: the other exact Gelus ->
   BiasGelu(x) without a bias. float16 rows whose static width is a multiple of 16 get com.raggedvit::BiasGelu
   (raggedvit's kernel, faster than ONNX Runtime's: docs/decisions.md); the others com.microsoft::BiasGelu (with a
   zero bias for `zero_bias_gelu`), whose CUDA kernel is vectorised where ONNX Runtime's Gelu kernels are not.
3. `skip_layer_norm`: LayerNormalization(Add(residual, Add(y, b))) whose sum is also the next residual ->
   com.microsoft::SkipLayerNormalization(y, residual, gamma, beta, b) (outputs: normalised, sum); the
   `..._cast` variant takes a Cast between the GEMM and the residual (the fp16 recipe: float16 GEMM, float32
   stream), with the bias added in float32; `skip_layer_norm_plain` fuses LayerNormalization(Add(a, b)) of two
   equally shaped [T, C] rows without a bias (a zero bias that torch.onnx's optimizer dropped, or LayerScale).
   `ragged_linear_skip_layer_norm`: LayerNormalization(RaggedLinear(x, W, b, residual, cu)) -> RaggedLinear(x, W,
   b, -, cu) + com.raggedvit::GatherLayerNorm(y, Range(0, T, 1), gamma, beta, Skip=residual, CuSeqlens=cu)
   (outputs: normalised, sum) for the rows its kernel takes (float16, D a multiple of 16 up to 4096, as rule 4):
   the residual leaves the GEMM's epilogue and the norm follows the live count like the GEMMs: the capacity
   layout's dead rows past cu[B] are neither read nor written (ONNX Runtime's SkipLayerNorm runs over every row,
   while only part of them are live after the stages). Other rows (float32, other widths) get
   SkipLayerNormalization(y, residual) (ONNX Runtime's SkipLayerNorm kernel is faster than its LayerNormalization
   kernel; docs/decisions.md). The normalised rows and
   the sum past cu[B] are dead (unspecified); their readers (the next RaggedLinear GEMMs and residuals, the next
   stage's gather, the head's rows) read live rows only (DESIGN.md section 4).
4. `gather_layer_norm`: a pruning stage's LayerNormalization(Gather(x, i)) -> com.raggedvit::GatherLayerNorm(x,
   i, gamma, beta) (outputs: normalised, the gathered rows, the next residual), for float16 rows whose static width
   is a multiple of 16 up to 4096 (its CUDA kernel): one pass over the kept rows in place of the Gather and ONNX
   Runtime's LayerNormalization kernel. The block's residual Add before the Gather stays (ONNX Runtime fuses it
   into the GEMM, after copying the residual into the output); absorbing it through the op's Skip input is not
   done here (docs/decisions.md). Validation is the same either way and without the op.
   (MatMul + Add left over before the head is fused by ONNX Runtime itself into a Gemm.)
5. `layer_norm_rows` (after the rules above took theirs): the other LayerNormalizations of the float16 [T, D] rows
   rule 4 takes (fp16-all's first norm1, over every token) -> com.raggedvit::GatherLayerNorm(x, Range(0, T, 1),
   gamma, beta), the same math on the same rows (the identity index; its Sum output, a copy of x, is not read); T
   from Shape / Squeeze, which ONNX Runtime folds into an index initializer once the batch is fixed (the op is
   faster than ONNX Runtime's LayerNormalization kernel: docs/decisions.md).
6. Index clean-ups of torch.onnx's indexing translations (one node each, on every stage): `flat_reshape` drops
   Reshape(x, [-1]) of a 1-D x; `gather_1d` turns GatherND(x, Unsqueeze(i, -1)) of a 1-D x into Gather(x, i).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common
from onnxscript.rewriter import pattern, rewrite

__all__ = ["RULES", "fuse_for_ort"]

_MS = "com.microsoft"
_RAGGED = "com.raggedvit"


def _rank1_const(value: ir.Value) -> bool:
    return value.const_value is not None and len(value.const_value.shape) == 1


def _plain_gemm(node: ir.Node) -> bool:
    a = node.attributes
    return (
        a.get_float("alpha", 1.0) == 1.0
        and a.get_float("beta", 1.0) == 1.0
        and a.get_int("transA", 0) == 0
        and a.get_int("transB", 0) == 1
    )


def _raggedvit_gelu(x: ir.Value) -> bool:
    """Whether com.raggedvit::BiasGelu takes x: float16 (its CPU kernel: float / float16; the exporter writes no
    float32 node of it) with a static last dim that is a multiple of 16 (its CUDA kernel's vector loads)."""
    n = x.shape[-1] if x.shape is not None and len(x.shape) else None
    return x.dtype == ir.DataType.FLOAT16 and isinstance(n, int) and n % 16 == 0


class BiasGelu(pattern.RewriteRuleClassBase):
    def pattern(self, op, y, b):
        return op.Gelu(op.Add(y, b), _allow_other_attributes=True, _outputs=["g"])

    def check(self, context, y, b, g, **_):
        ok = pattern.MatchResult()
        if g.producer().attributes.get_string("approximate", "none") != "none":
            return ok.fail("tanh GELU")
        if not _rank1_const(b):
            return ok.fail("bias is not a constant 1-D tensor")
        return ok

    def rewrite(self, op, y, b, **_):
        return op.BiasGelu(y, b, _domain=_RAGGED if _raggedvit_gelu(y) else _MS)


class ZeroBiasGelu(pattern.RewriteRuleClassBase):
    def pattern(self, op, x):
        return op.Gelu(x, _allow_other_attributes=True, _outputs=["g"])

    def check(self, context, x, g, **_):
        ok = pattern.MatchResult()
        if g.producer().attributes.get_string("approximate", "none") != "none":
            return ok.fail("tanh GELU")
        if x.shape is None or not isinstance(x.shape[-1], int) or x.dtype is None:
            return ok.fail("last dimension or dtype unknown")
        return ok

    def rewrite(self, op, x, **_):
        if _raggedvit_gelu(x):
            return op.BiasGelu(x, _domain=_RAGGED)
        zeros = np.zeros(x.shape[-1], dtype=x.dtype.numpy())
        bias = op.initializer(ir.tensor(zeros), name=f"{x.name}_zero_bias")
        return op.BiasGelu(x, bias, _domain=_MS)


class PatchBiasIntoPosition(pattern.RewriteRuleClassBase):
    """Add(Concat(prefix, Add(y, b), axis=1), pos) -> Add(Concat(prefix, y, axis=1), pos') with pos' = pos + b on
    the patch rows: the patch embedding's bias joins the position embedding in the file (one rounding of pos + b,
    then one of y + that), so the patch GEMM needs no bias pass over its [B, N, C] output."""

    def pattern(self, op, prefix, y, b, pos):
        cat = op.Concat(prefix, op.Add(y, b), _allow_other_attributes=True, _outputs=["cat"])
        return op.Add(cat, pos)

    def check(self, context, prefix, y, b, pos, cat, **_):
        ok = pattern.MatchResult()
        if cat.producer().attributes.get_int("axis", 0) not in (1, -2):
            return ok.fail("not a concat of rows")
        if not _rank1_const(b) or pos.const_value is None or _rank(prefix) != 3 or _rank(y) != 3:
            return ok.fail("bias / position are not constants, or the parts are not [B, rows, C]")
        p, C = prefix.shape[1], b.const_value.shape[0]
        shape = tuple(pos.const_value.shape)
        if not isinstance(p, int) or len(shape) != 3 or shape[0] != 1 or shape[2] != C or not 0 <= p <= shape[1]:
            return ok.fail("position embedding is not [1, rows, C] over a static prefix")
        if y.shape[1] != shape[1] - p or y.shape[2] != C or not (b.dtype == pos.dtype == y.dtype):
            return ok.fail("rows, width or dtype do not line up")
        if len(b.uses()) != 1:
            return ok.fail("the bias has other users")
        return ok

    def rewrite(self, op, prefix, y, b, pos, cat, **_):
        p = prefix.shape[1]
        table = pos.const_value.numpy().copy()
        table[:, p:, :] += b.const_value.numpy()
        merged = op.initializer(ir.tensor(table), name=f"{pos.name}_with_{b.name}")
        return op.Add(op.Concat(prefix, y, axis=1), merged)


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
        if not (_rank1_const(b) and _rank1_const(gamma) and _rank1_const(beta)):
            return ok.fail("bias / gamma / beta are not constant 1-D tensors")
        if residual.dtype != gamma.dtype or residual.dtype != beta.dtype:
            return ok.fail("residual and LayerNorm weights differ in dtype")
        return ok

    def rewrite(self, op, y, b, residual, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        if self._cast:  # the GEMM output joins the stream's dtype first; its bias is added in that dtype
            to = residual.dtype
            y = op.Cast(y, to=to)
            b = op.initializer(ir.tensor(b.const_value.numpy().astype(to.numpy())), name=f"{b.name}_{to.name}")
        normed, _mean, _inv_std, total = op.SkipLayerNormalization(
            y, residual, gamma, beta, b, epsilon=eps, _domain=_MS, _outputs=4
        )
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
        if a.const_value is not None or b.const_value is not None or _rank(a) != 2 or _rank(b) != 2:
            return ok.fail("not a sum of two [T, C] rows")
        if a.shape[1] != b.shape[1] or a.dtype != b.dtype or a.dtype != gamma.dtype:
            return ok.fail("the rows differ in width or dtype")
        if not (_rank1_const(gamma) and _rank1_const(beta)):
            return ok.fail("gamma / beta are not constant 1-D tensors")
        return ok

    def rewrite(self, op, a, b, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        normed, _mean, _inv_std, total = op.SkipLayerNormalization(
            a, b, gamma, beta, epsilon=eps, _domain=_MS, _outputs=4
        )
        return normed, total


class RaggedLinearSkipLayerNorm(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, w, b, residual, cu, gamma, beta):
        y = op.RaggedLinear(x, w, b, residual, cu, _domain=_RAGGED, _allow_other_attributes=True,
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
        if _rank(residual) != 2 or residual.dtype != gamma.dtype:
            return ok.fail("the residual is not [T, C] rows of the LayerNorm's dtype")
        if not (_rank1_const(gamma) and _rank1_const(beta)):
            return ok.fail("gamma / beta are not constant 1-D tensors")
        return ok

    def rewrite(self, op, x, w, b, residual, cu, gamma, beta, y, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        gemm = op.RaggedLinear(x, w, b, None, cu, activation=0, _domain=_RAGGED)
        if _not_norm_kernel_rows(residual, gamma, beta) is None:  # the residual has y's shape and dtype
            index = _row_range(op, gemm, ln.name or y.name)
            normed, total = op.GatherLayerNorm(
                gemm, index, gamma, beta, residual, None, cu, epsilon=eps, _domain=_RAGGED, _outputs=2
            )
            return normed, total
        normed, _mean, _inv_std, total = op.SkipLayerNormalization(
            gemm, residual, gamma, beta, epsilon=eps, _domain=_MS, _outputs=4
        )
        return normed, total


def _rank(value: ir.Value) -> int | None:
    return value.shape.rank() if value.shape is not None else None


def _not_row_norm(ln: ir.Value) -> str | None:
    """Why the LayerNormalization producing `ln` is not a float32-stash norm over the rows' last axis (axis -1, or 1
    of the rank-2 rows that `_not_norm_kernel_rows` requires), None when it is."""
    attrs = ln.producer().attributes
    if attrs.get_int("axis", -1) not in (-1, 1) or attrs.get_int("stash_type", 1) != 1:
        return "not a float32-stash LayerNormalization over the last axis"
    return None


def _not_norm_kernel_rows(x: ir.Value, gamma: ir.Value, beta: ir.Value) -> str | None:
    """Why com.raggedvit::GatherLayerNorm's kernels do not take the rows x with weights gamma, beta, None when they
    do: float16 [T, D] rows (not a constant) of a static D that is a multiple of 16 up to the CUDA kernel's widest
    row, gamma / beta constant 1-D tensors of x's dtype."""
    if _rank(x) != 2 or x.dtype != ir.DataType.FLOAT16 or x.const_value is not None:
        return "not float16 [T, D] rows"
    from raggedvit.kernels._norm_kernel import NORM_BLOCK_DS  # the CUDA kernel's widest row: its cubins' last

    D = x.shape[1]
    if not isinstance(D, int) or D % 16 != 0 or D > max(NORM_BLOCK_DS):
        return f"D not static, not a multiple of 16 or above {max(NORM_BLOCK_DS)}"
    if not (_rank1_const(gamma) and _rank1_const(beta) and gamma.dtype == beta.dtype == x.dtype):
        return "gamma / beta are not constant 1-D tensors of x's dtype"
    return None


class GatherLayerNorm(pattern.RewriteRuleClassBase):
    """LayerNormalization(Gather(x, i)) -> com.raggedvit::GatherLayerNorm(x, i, gamma, beta) (outputs: normalised,
    the gathered rows)."""

    def pattern(self, op, x, i, gamma, beta):
        gathered = op.Gather(x, i, _allow_other_attributes=True, _outputs=["g"])
        normed = op.LayerNormalization(gathered, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])
        return normed, gathered  # the gathered rows are the next residual too: an output of the pattern

    def check(self, context, x, i, gamma, beta, g, ln, **_):
        ok = pattern.MatchResult()
        if (why := _not_row_norm(ln)) is not None:
            return ok.fail(why)
        if g.producer().attributes.get_int("axis", 0) != 0 or _rank(i) != 1 or i.dtype != ir.DataType.INT64:
            return ok.fail("not a row gather by a 1-D int64 index")
        if (why := _not_norm_kernel_rows(x, gamma, beta)) is not None:
            return ok.fail(why)
        return ok

    def rewrite(self, op, x, i, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        normed, gathered = op.GatherLayerNorm(x, i, gamma, beta, epsilon=eps, _domain=_RAGGED, _outputs=2)
        return normed, gathered


class LayerNormRows(pattern.RewriteRuleClassBase):
    """LayerNormalization(x, gamma, beta) of float16 [T, D] rows -> com.raggedvit::GatherLayerNorm(x, Range(0, T, 1),
    gamma, beta) (the identity index: the same rows, the same math); its Sum output (a copy of x) is not read."""

    def pattern(self, op, x, gamma, beta):
        return op.LayerNormalization(x, gamma, beta, _allow_other_attributes=True, _outputs=["ln"])

    def check(self, context, x, gamma, beta, ln, **_):
        ok = pattern.MatchResult()
        if (why := _not_row_norm(ln)) is not None:
            return ok.fail(why)
        node = ln.producer()
        graph_outputs = set(node.graph.outputs) if node.graph is not None else set()
        if any(v.uses() or v in graph_outputs for v in node.outputs[1:]):
            return ok.fail("the mean / inverse std outputs are read")
        if (why := _not_norm_kernel_rows(x, gamma, beta)) is not None:
            return ok.fail(why)
        return ok

    def rewrite(self, op, x, gamma, beta, ln, **_):
        eps = ln.producer().attributes.get_float("epsilon", 1e-5)
        index = _row_range(op, x, ln.name or x.name)
        normed, _sum = op.GatherLayerNorm(x, index, gamma, beta, epsilon=eps, _domain=_RAGGED, _outputs=2)
        return normed


def _row_range(op, x: ir.Value, name: str) -> ir.Value:
    """Range(0, T, 1) over the rows of x [T, D] (int64; T from Shape / Squeeze, which ONNX Runtime folds into an
    initializer once the batch is fixed): GatherLayerNorm's identity index."""
    start = op.initializer(ir.tensor(np.array(0, dtype=np.int64)), name=f"{name}_rows_start")
    delta = op.initializer(ir.tensor(np.array(1, dtype=np.int64)), name=f"{name}_rows_delta")
    rows = op.Squeeze(op.Shape(x, start=0, end=1))  # T as an int64 scalar
    return op.Range(start, rows, delta)


_PATCH_PERM = (0, 2, 4, 1, 3, 5)  # [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p]: torch's im2col of a stride-p conv


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _embed_parts(cat: ir.Value) -> tuple[ir.Value, ir.Value, list[ir.Value], int] | str:
    """(images, weight [K, N], prefix constants [1, n, N], patch) of Concat(Expand(prefix)..., MatMul(Reshape(
    Transpose(Reshape(images)))), axis=1): a ViT's patch embedding as torch.onnx writes it; else why not."""
    concat = _producer(cat, "Concat")
    if concat is None or concat.attributes.get_int("axis", 0) not in (1, -2):
        return "not a concat of rows"
    *parts, y = concat.inputs
    mm = _producer(y, "MatMul")
    if mm is None or mm.inputs[1].const_value is None or len(mm.inputs[1].const_value.shape) != 2:
        return "the patch rows are not a MatMul by a constant [K, N]"
    flat = _producer(mm.inputs[0], "Reshape")
    tr = _producer(flat.inputs[0], "Transpose") if flat is not None else None
    grid = _producer(tr.inputs[0], "Reshape") if tr is not None else None
    if grid is None or tuple(tr.attributes.get_ints("perm", ())) != _PATCH_PERM:
        return "not Reshape / Transpose (0, 2, 4, 1, 3, 5) / Reshape of the image"
    images, view = grid.inputs[0], grid.outputs[0]
    if _rank(images) != 4 or images.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16) or _rank(view) != 6:
        return "the image is not float [B, C, H, W] cut into [B, C, gh, p, gw, p]"
    B, C, H, W = images.shape
    _, c, gh, p, gw, p2 = view.shape
    K, N = mm.inputs[1].const_value.shape
    static = all(isinstance(d, int) for d in (C, H, W, c, gh, p, gw, p2))
    if not static or (c, p2, H, W, K) != (C, p, gh * p, gw * p, C * p * p):
        return "the image, patch grid and weight do not line up"
    if _rank(flat.outputs[0]) != 3 or tuple(flat.outputs[0].shape)[1:] != (gh * gw, K) or N % 16 != 0:
        return "the patch rows are not [B, gh * gw, K], or N is not a multiple of 16"
    prefix = []
    for part in parts:
        ex = _producer(part, "Expand")
        const = ex.inputs[0].const_value if ex is not None else None
        if const is None or len(const.shape) != 3 or const.shape[0] != 1 or const.shape[2] != N:
            return "a prefix part is not Expand of a constant [1, n, N]"
        prefix.append(ex.inputs[0])
    return images, mm.inputs[1], prefix, p


class PatchEmbed(pattern.RewriteRuleClassBase):
    """Cast(Add(Concat(Expand(prefix)..., MatMul(im2col(images), W), axis=1), pos), to=float16) ->
    com.raggedvit::PatchEmbed(images, W in float16, prefix, pos, patch) (the fp16-all recipe's embedding: the
    image, the GEMM and the position table in float32, then cast into the float16 stream)."""

    def pattern(self, op, cat, pos):
        return op.Cast(op.Add(cat, pos), _allow_other_attributes=True, _outputs=["out"])

    def check(self, context, cat, pos, out, **_):
        ok = pattern.MatchResult()
        if out.producer().attributes.get_int("to", 0) != ir.DataType.FLOAT16:
            return ok.fail("not a cast to float16")
        parts = _embed_parts(cat)
        if isinstance(parts, str):
            return ok.fail(parts)
        images, w, prefix, p = parts
        N = w.const_value.shape[1]
        rows = sum(c.const_value.shape[1] for c in prefix) + (images.shape[2] // p) * (images.shape[3] // p)
        table = pos.const_value
        if table is None or table.dtype != ir.DataType.FLOAT or tuple(table.shape) not in ((1, rows, N), (rows, N)):
            return ok.fail("the position table is not a float32 constant [1, P + L, N]")
        if w.dtype != ir.DataType.FLOAT or any(c.dtype != ir.DataType.FLOAT for c in prefix):
            return ok.fail("weight or prefix not float32")
        return ok

    def rewrite(self, op, cat, pos, out, **_):
        images, w, prefix, p = _embed_parts(cat)  # type: ignore[misc]
        N = w.const_value.shape[1]
        w16 = op.initializer(ir.tensor(w.const_value.numpy().astype(np.float16)), name=f"{w.name}_fp16")
        rows = [c.const_value.numpy().reshape(-1, N) for c in prefix]
        head = np.concatenate(rows, axis=0) if rows else np.zeros((0, N), np.float32)
        pre = op.initializer(ir.tensor(np.ascontiguousarray(head, dtype=np.float32)), name=f"{pos.name}_prefix")
        table = op.initializer(ir.tensor(pos.const_value.numpy().reshape(-1, N)), name=f"{pos.name}_rows")
        embedded = op.PatchEmbed(images, w16, pre, table, patch=p, _domain=_RAGGED)
        embedded.shape, embedded.type = out.shape, out.type
        return embedded


def _const_ints(value: ir.Value) -> list[int] | None:
    if value.const_value is None:
        return None
    return [int(v) for v in value.const_value.numpy().reshape(-1)]


class FlatReshape(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _allow_other_attributes=True)

    def check(self, context, x, shape, **_):
        ok = pattern.MatchResult()
        if _rank(x) != 1 or _const_ints(shape) != [-1]:
            return ok.fail("not a flattening of a 1-D tensor")
        return ok

    def rewrite(self, op, x, shape, **_):
        return op.Identity(x)


class Gather1d(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, i, axes):
        return op.GatherND(x, op.Unsqueeze(i, axes), _allow_other_attributes=True, _outputs=["g"])

    def check(self, context, x, i, axes, g, **_):
        ok = pattern.MatchResult()
        if _rank(x) != 1 or _rank(i) is None or _const_ints(axes) not in ([-1], [_rank(i)]):
            return ok.fail("not a 1-D lookup")
        if g.producer().attributes.get_int("batch_dims", 0) != 0:
            return ok.fail("batch_dims != 0")
        return ok

    def rewrite(self, op, x, i, axes, **_):
        return op.Gather(x, i, axis=0)


RULES: tuple[pattern.RewriteRuleSet, ...] = (
    pattern.RewriteRuleSet([PatchBiasIntoPosition.rule("patch_bias_into_position")]),
    pattern.RewriteRuleSet([PatchEmbed.rule("patch_embed")]),
    pattern.RewriteRuleSet([*BiasGelu.rule("bias_gelu").commute()]),
    pattern.RewriteRuleSet([ZeroBiasGelu.rule("zero_bias_gelu")]),
    pattern.RewriteRuleSet(
        [
            SkipLayerNorm.rule(f"skip_layer_norm{'_cast' if cast else ''}", cast=cast, residual_first=first)
            for cast in (False, True)
            for first in (True, False)
        ]
        + [PlainSkipLayerNorm.rule("skip_layer_norm_plain")]
    ),
    pattern.RewriteRuleSet([RaggedLinearSkipLayerNorm.rule("ragged_linear_skip_layer_norm")]),
    pattern.RewriteRuleSet([GatherLayerNorm.rule("gather_layer_norm")]),
    pattern.RewriteRuleSet([LayerNormRows.rule("layer_norm_rows")]),  # after the rules above take their LayerNorms
    pattern.RewriteRuleSet(
        [
            FlatReshape.rule("flat_reshape"),
            Gather1d.rule("gather_1d"),
        ]
    ),
)


def gemm_to_matmul(model: ir.Model) -> int:
    """Every Gemm(x, W[, b]) with a constant 2-D W, transB=1 (alpha = beta = 1, transA = 0) -> MatMul(x, W^T)
    [+ Add(b)], W^T a new initializer (shared by Gemms of the same W). Returns the number of Gemms replaced."""
    graph = model.graph
    transposed: dict[str, ir.Value] = {}
    done = 0
    for node in list(graph):
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or not _plain_gemm(node):
            continue
        x, w = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if w is None or w.const_value is None or len(w.const_value.shape) != 2:
            continue
        if w.name not in transposed:
            wt = ir.Value(name=f"{w.name}_t", const_value=ir.tensor(np.ascontiguousarray(w.const_value.numpy().T)))
            wt.shape, wt.type = wt.const_value.shape, ir.TensorType(wt.const_value.dtype)
            graph.register_initializer(wt)
            transposed[w.name] = wt
        mm = ir.node("MatMul", [x, transposed[w.name]])
        new = [mm]
        if c is not None:
            new.append(ir.node("Add", [mm.outputs[0], c]))
        out = new[-1].outputs[0]
        out.shape, out.type = node.outputs[0].shape, node.outputs[0].type
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, [node.outputs[0]], [out])
        done += 1
    return done


def drop_unused_outputs(model: ir.Model, op_type: str = "RaggedAttention") -> int:
    """Trailing optional outputs nobody reads are removed from `op_type` nodes (a RaggedAttention with a cls_attn
    output computes it: a second kernel per block). Returns the number of nodes changed."""
    graph = model.graph
    graph_outputs = set(graph.outputs)
    done = 0
    for node in list(graph):
        if node.op_type != op_type:
            continue
        keep = len(node.outputs)
        while keep > 1 and not node.outputs[keep - 1].uses() and node.outputs[keep - 1] not in graph_outputs:
            keep -= 1
        if keep == len(node.outputs):
            continue
        new = ir.node(
            node.op_type,
            list(node.inputs),
            {a.name: a for a in node.attributes.values()},
            domain=node.domain,
            num_outputs=keep,
            name=node.name,
        )
        for old, value in zip(node.outputs[:keep], new.outputs):
            value.name, value.shape, value.type = old.name, old.shape, old.type
        ir.convenience.replace_nodes_and_values(
            graph, node, [node], [new], list(node.outputs[:keep]), list(new.outputs)
        )
        done += 1
    return done


def fold_weight_layout(model: ir.Model) -> int:
    """Reshape(W, shape) and Transpose(W) of constant W (and constant shape), in graph order so chains fold, ->
    one new initializer each. Returns the number of nodes folded."""
    graph = model.graph
    done = 0
    for node in list(graph):
        if node.op_type not in ("Reshape", "Transpose") or node.domain not in ("", "ai.onnx"):
            continue
        ins = [v for v in node.inputs if v is not None]
        if not ins or any(v.const_value is None for v in ins) or len(node.outputs) != 1:
            continue
        x = ins[0].const_value.numpy()
        if node.op_type == "Reshape":
            if len(ins) != 2:
                continue
            shape = [int(d) for d in ins[1].const_value.numpy().reshape(-1)]
            if not node.attributes.get_int("allowzero", 0):
                shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]  # 0: copy the input's dim
            y = x.reshape(shape)
        else:
            perm = node.attributes.get_ints("perm", None)
            y = np.transpose(x, None if perm is None else [int(a) for a in perm])
        old = node.outputs[0]
        name = f"{ins[0].name}_{node.op_type.lower()}"  # e.g. model.vit.patch_embed.proj.weight_reshape_transpose
        new = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(y)))
        new.shape, new.type = new.const_value.shape, ir.TensorType(new.const_value.dtype)
        graph.register_initializer(new)
        old.replace_all_uses_with(new)
        if old in graph.outputs:
            graph.outputs[graph.outputs.index(old)] = new
        graph.remove(node, safe=True)
        done += 1
    return done


def fuse_for_ort(model: ir.Model) -> ir.Model:
    """fold_weight_layout, gemm_to_matmul, drop_unused_outputs, then RULES in order, then drop dead nodes and
    initializers."""
    fold_weight_layout(model)
    gemm_to_matmul(model)
    drop_unused_outputs(model)
    for rules in RULES:
        model = rewrite(model, pattern_rewrite_rules=rules)
    for cleanup in (
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
        common.RemoveUnusedOpsetsPass(),
    ):
        model = cleanup(model).model
    return model
