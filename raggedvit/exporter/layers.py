"""Per-row layers on packed [T, C] activations: LayerNorm, Linear, GELU.

fp16-all recipe (GraphBuilder stream_dtype float16 too): the residual stream and its LayerNorms /
SkipLayerNormalizations are float16 as well, so a block has no Cast; the patch embedding (cast once after the
position embedding), the pruning scores (LayerNormalization moments come out float32) and the head (the class
rows are cast back) stay float32. Fewer, lighter kernels; less accurate than the fp16 recipe below.

fp16 export recipe (GraphBuilder.compute_dtype float16): the residual stream, every LayerNorm of it and the
classifier head (final norm + head GEMM) are float32; only the block GEMMs (qkv, proj, fc1, fc2), the ragged
attention and BiasGelu run in float16. A LayerNorm feeding a GEMM is cast to float16 after it; the proj / fc2
outputs (fp16 bias add) are cast to float32 before the residual Add: 4 Cast nodes per block.
Where the fp16 error comes from (per GEMM, weights / inputs / outputs, attention, stream): scripts/precision_budget.py
and its result benchmarks/results/precision_budget_2026-11-29_cpu.json. No fp16 recipe measured or emulated gets under
the validator's 0.004 on the seeded deit_base test weights: rounding the weights alone moves the logits by ~4e-3.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from raggedvit.exporter._builder import GraphBuilder, onnx_dtype

__all__ = [
    "bias_gelu",
    "float32_to_stream",
    "layer_norm",
    "linear",
    "maybe_layer_norm",
    "stream_to_float32",
    "to_compute",
    "to_stream",
]


def to_compute(g: GraphBuilder, x: str, hint: str) -> str:
    """Cast a float32 stream tensor to the GEMM dtype (no node when they agree)."""
    return g.op("Cast", [x], hint=f"{hint}.h", to=g.elem) if g.mixed else x


def to_stream(g: GraphBuilder, x: str, hint: str) -> str:
    """Cast a GEMM-dtype tensor to the float32 stream dtype (no node when they agree)."""
    return g.op("Cast", [x], hint=f"{hint}.f", to=g.stream_elem) if g.mixed else x


def stream_to_float32(g: GraphBuilder, x: str, hint: str) -> str:
    """Rows of the residual stream as float32 (a Cast only in fp16-all exports, whose stream is float16)."""
    return x if g.stream_dtype == np.float32 else g.op("Cast", [x], hint=hint, to=onnx_dtype(np.float32))


def float32_to_stream(g: GraphBuilder, x: str, hint: str) -> str:
    """A float32 tensor in the residual stream's dtype (a Cast only in fp16-all exports)."""
    return x if g.stream_dtype == np.float32 else g.op("Cast", [x], hint=hint, to=g.stream_elem)


def layer_norm(g: GraphBuilder, x: str, ln: nn.LayerNorm, hint: str, *, dtype: type = np.float32) -> str:
    """LayerNormalization over the last axis; x [..., C] -> [..., C], weights (and x) in `dtype`."""
    scale = g.weight(ln.weight, f"{hint}.weight", dtype=dtype)
    inputs = [x, scale]
    if ln.bias is not None:
        inputs.append(g.weight(ln.bias, f"{hint}.bias", dtype=dtype))
    return g.op("LayerNormalization", inputs, hint=hint, axis=-1, epsilon=float(ln.eps))


def maybe_layer_norm(g: GraphBuilder, x: str, ln: nn.Module | None, hint: str, *, dtype: type = np.float32) -> str:
    """layer_norm unless `ln` is None/Identity."""
    if ln is None or isinstance(ln, nn.Identity):
        return x
    return layer_norm(g, x, ln, hint, dtype=dtype)


def linear(g: GraphBuilder, x: str, fc: nn.Linear, hint: str, *, bias: bool = True, dtype: type | None = None) -> str:
    """x [T, in] @ W^T [in, out] (+ b) -> [T, out], weights in `dtype` (default: the GEMM dtype).

    With bias=False the bias is left to the caller."""
    y = g.op("MatMul", [x, g.weight(fc.weight, f"{hint}.weight_t", transpose=True, dtype=dtype)], hint=f"{hint}.mm")
    if bias and fc.bias is not None:
        y = g.op("Add", [y, g.weight(fc.bias, f"{hint}.bias", dtype=dtype)], hint=hint)
    return y


def bias_gelu(g: GraphBuilder, x: str, fc: nn.Linear, hint: str) -> str:
    """Exact (erf) GELU of x + fc.bias as com.microsoft::BiasGelu (CPU and CUDA EPs, fp32/fp16)."""
    b = fc.bias if fc.bias is not None else fc.weight.new_zeros(fc.out_features)
    return g.op("BiasGelu", [x, g.weight(b, f"{hint}.bias")], domain="com.microsoft", hint=f"{hint}.gelu")
