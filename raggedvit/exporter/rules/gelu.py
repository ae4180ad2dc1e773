"""GELU rules: `bias_gelu`: Gelu(Add(y, b)) -> BiasGelu(y, b) (exact GELU); `zero_bias_gelu`: the other exact
Gelus -> BiasGelu(x) without a bias. float16 rows whose static width is a multiple of 16 get
com.raggedvit::BiasGelu (raggedvit's kernel, faster than ONNX Runtime's: docs/decisions.md); the others
com.microsoft::BiasGelu (with a zero bias for `zero_bias_gelu`), whose CUDA kernel is vectorised where ONNX
Runtime's Gelu kernels are not.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from raggedvit.exporter.rules._common import MS, RAGGED, rank1_const

__all__ = ["BiasGelu", "ZeroBiasGelu"]


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
        if not rank1_const(b):
            return ok.fail("bias is not a constant 1-D tensor")
        return ok

    def rewrite(self, op, y, b, **_):
        return op.BiasGelu(y, b, _domain=RAGGED if _raggedvit_gelu(y) else MS)


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
            return op.BiasGelu(x, _domain=RAGGED)
        zeros = np.zeros(x.shape[-1], dtype=x.dtype.numpy())
        bias = op.initializer(ir.tensor(zeros), name=f"{x.name}_zero_bias")
        return op.BiasGelu(x, bias, _domain=MS)
