"""Per-row layers on packed [T, C] activations: LayerNorm, Linear, GELU."""

from __future__ import annotations

from torch import nn

from raggedvit.exporter._builder import GraphBuilder

__all__ = ["layer_norm", "linear", "maybe_layer_norm"]


def layer_norm(g: GraphBuilder, x: str, ln: nn.LayerNorm, hint: str) -> str:
    """LayerNormalization over the last axis; x [..., C] -> [..., C]."""
    scale = g.weight(ln.weight, f"{hint}.weight")
    inputs = [x, scale]
    if ln.bias is not None:
        inputs.append(g.weight(ln.bias, f"{hint}.bias"))
    return g.op("LayerNormalization", inputs, hint=hint, axis=-1, epsilon=float(ln.eps))


def maybe_layer_norm(g: GraphBuilder, x: str, ln: nn.Module | None, hint: str) -> str:
    """layer_norm unless `ln` is None/Identity."""
    if ln is None or isinstance(ln, nn.Identity):
        return x
    return layer_norm(g, x, ln, hint)


def linear(g: GraphBuilder, x: str, fc: nn.Linear, hint: str, *, bias: bool = True) -> str:
    """x [T, in] @ W^T [in, out] (+ b) -> [T, out]; with bias=False the bias is left to the caller."""
    y = g.op("MatMul", [x, g.weight(fc.weight, f"{hint}.weight_t", transpose=True)], hint=f"{hint}.mm")
    if bias and fc.bias is not None:
        y = g.op("Add", [y, g.weight(fc.bias, f"{hint}.bias")], hint=hint)
    return y


def bias_gelu(g: GraphBuilder, x: str, fc: nn.Linear, hint: str) -> str:
    """Exact (erf) GELU of x + fc.bias as com.microsoft::BiasGelu (CPU and CUDA EPs, fp32/fp16)."""
    b = fc.bias if fc.bias is not None else fc.weight.new_zeros(fc.out_features)
    return g.op("BiasGelu", [x, g.weight(b, f"{hint}.bias")], domain="com.microsoft", hint=f"{hint}.gelu")
