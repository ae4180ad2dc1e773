"""Rules of the patch embedding.

- `patch_bias_into_position`: Add(Concat(prefix, Add(y, b)), pos) -> Add(Concat(prefix, y), pos + b on the patch
  rows): the patch embedding's bias rides in the position table (ViT's embedding; ONNX Runtime otherwise runs the
  patch GEMM as a Gemm whose bias is first broadcast into the whole output: docs/decisions.md).
- `patch_embed`: Cast(Add(Concat(Expand(prefix)..., MatMul(im2col(images), W)), pos), float16) ->
  com.raggedvit::PatchEmbed(images, W in float16, prefix rows, pos, patch) when N is a multiple of 16: the fp16-all
  embedding as one kernel that reads the image once (in place of ONNX Runtime's float32 chain: Transpose / TF32
  MatMul / Concat / Add / Cast; docs/decisions.md); the pixels and W are rounded to float16 (the TF32 GEMM it
  replaces kept 10 bits of their mantissas too). The fp16 recipe (float32 stream) keeps the float32 chain.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from raggedvit.exporter.rules._common import RAGGED, producer, rank, rank1_const, typed

__all__ = ["PatchBiasIntoPosition", "PatchEmbed"]


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
        if not rank1_const(b) or pos.const_value is None or rank(prefix) != 3 or rank(y) != 3:
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
        return op.Add(typed(op.Concat(prefix, y, axis=1), cat.dtype, cat.shape), merged)


_PATCH_PERM = (0, 2, 4, 1, 3, 5)  # [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p]: torch's im2col of a stride-p conv


def _embed_parts(cat: ir.Value) -> tuple[ir.Value, ir.Value, list[ir.Value], int] | str:
    """(images, weight [K, N], prefix constants [1, n, N], patch) of Concat(Expand(prefix)..., MatMul(Reshape(
    Transpose(Reshape(images)))), axis=1): a ViT's patch embedding as torch.onnx writes it; else why not."""
    concat = producer(cat, "Concat")
    if concat is None or concat.attributes.get_int("axis", 0) not in (1, -2):
        return "not a concat of rows"
    *parts, y = concat.inputs
    mm = producer(y, "MatMul")
    if mm is None or mm.inputs[1].const_value is None or len(mm.inputs[1].const_value.shape) != 2:
        return "the patch rows are not a MatMul by a constant [K, N]"
    flat = producer(mm.inputs[0], "Reshape")
    tr = producer(flat.inputs[0], "Transpose") if flat is not None else None
    grid = producer(tr.inputs[0], "Reshape") if tr is not None else None
    if grid is None or tuple(tr.attributes.get_ints("perm", ())) != _PATCH_PERM:
        return "not Reshape / Transpose (0, 2, 4, 1, 3, 5) / Reshape of the image"
    images, view = grid.inputs[0], grid.outputs[0]
    if rank(images) != 4 or images.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16) or rank(view) != 6:
        return "the image is not float [B, C, H, W] cut into [B, C, gh, p, gw, p]"
    B, C, H, W = images.shape
    _, c, gh, p, gw, p2 = view.shape
    K, N = mm.inputs[1].const_value.shape
    static = all(isinstance(d, int) for d in (C, H, W, c, gh, p, gw, p2))
    if not static or (c, p2, H, W, K) != (C, p, gh * p, gw * p, C * p * p):
        return "the image, patch grid and weight do not line up"
    if rank(flat.outputs[0]) != 3 or tuple(flat.outputs[0].shape)[1:] != (gh * gw, K) or N % 16 != 0:
        return "the patch rows are not [B, gh * gw, K], or N is not a multiple of 16"
    prefix = []
    for part in parts:
        ex = producer(part, "Expand")
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
        embedded = op.PatchEmbed(images, w16, pre, table, patch=p, _domain=RAGGED)
        embedded.shape, embedded.type = out.shape, out.type
        return embedded
