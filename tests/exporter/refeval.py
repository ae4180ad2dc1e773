"""onnx.reference evaluation of exported graphs without the op library (RaggedAttention, both BiasGelus and
SkipLayerNormalization in Python).

Used to check the graph's own arithmetic (e.g. fp16) independently of the ORT kernels.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from raggedvit.kernels import ragged_attention_reference


class RaggedAttention(OpRun):
    op_domain = "com.raggedvit"

    def _run(self, qkv, cu, bias=None, num_heads=None, scale=None, max_seqlen=None):
        if bias is not None:  # added in qkv's dtype, as the kernels do
            qkv = (qkv + bias).astype(qkv.dtype)
        out, cls = ragged_attention_reference(
            torch.from_numpy(qkv), torch.from_numpy(cu.astype(np.int64)), num_heads, scale=scale, return_cls_attn=True
        )
        return out.numpy(), cls.numpy()


class BiasGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, bias=None):
        y = torch.from_numpy(x.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64)))
        return ((0.5 * y * (1.0 + torch.erf(y / math.sqrt(2.0)))).numpy().astype(x.dtype),)


# com.raggedvit::BiasGelu: the same function (onnx.reference takes the op type from the class name)
RaggedBiasGelu = type("BiasGelu", (BiasGelu,), {"op_domain": "com.raggedvit"})


class SkipLayerNormalization(OpRun):
    """com.microsoft::SkipLayerNormalization: (LN(x + skip + bias), mean, inv_std, x + skip + bias)."""

    op_domain = "com.microsoft"

    def _run(self, x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
        s = x.astype(np.float64) + skip.astype(np.float64)
        if bias is not None:
            s = s + bias.astype(np.float64)
        mean = s.mean(-1, keepdims=True)
        inv_std = 1.0 / np.sqrt(((s - mean) ** 2).mean(-1, keepdims=True) + epsilon)
        y = (s - mean) * inv_std * gamma.astype(np.float64)
        if beta is not None:
            y = y + beta.astype(np.float64)
        return y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32), s.astype(x.dtype)


def reference_evaluator(model) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[RaggedAttention, BiasGelu, RaggedBiasGelu, SkipLayerNormalization])
