"""A tiny ONNX graph builder: unique names, deduplicated constants, typed weights."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

__all__ = ["GraphBuilder", "onnx_dtype"]

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def onnx_dtype(dtype: np.dtype | type) -> int:
    """numpy dtype -> ONNX TensorProto element type."""
    return _NP_TO_ONNX[np.dtype(dtype)]


class GraphBuilder:
    """Collects nodes, initializers and value infos; every tensor name is unique.

    `compute_dtype` (float32 or float16) is the dtype of the block GEMM weights stored with `weight()`
    and of the GEMM / attention / GELU activations. `stream_dtype` is the dtype of the residual stream
    between and inside blocks and of its LayerNorms: float32 by default (the "fp16" recipe), float16 for
    "fp16-all". The patch embedding, the pruning scores and the classifier head are float32 in every export:
    see raggedvit/exporter/layers.py for the recipes.
    """

    def __init__(self, compute_dtype: type = np.float32, stream_dtype: type = np.float32) -> None:
        self.compute_dtype = np.dtype(compute_dtype)
        self.stream_dtype = np.dtype(stream_dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self._used: dict[str, int] = {}
        self._consts: dict[tuple, str] = {}

    @property
    def elem(self) -> int:
        """ONNX element type of the compute dtype."""
        return onnx_dtype(self.compute_dtype)

    @property
    def stream_elem(self) -> int:
        """ONNX element type of the residual stream (float32)."""
        return onnx_dtype(self.stream_dtype)

    @property
    def mixed(self) -> bool:
        """True when the GEMMs run in a narrower dtype than the float32 residual stream."""
        return self.compute_dtype != self.stream_dtype

    # ---- names -------------------------------------------------------------------------
    def name(self, hint: str) -> str:
        """A fresh tensor/node name starting with `hint`."""
        n = self._used.get(hint, 0)
        self._used[hint] = n + 1
        return hint if n == 0 else f"{hint}_{n}"

    # ---- constants and weights -------------------------------------------------------------
    def const(self, value: np.ndarray | Sequence | float | int, dtype: type | None = None, hint: str = "c") -> str:
        """An initializer holding `value` (deduplicated by dtype, shape and bytes)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.name(hint)
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def weight(self, tensor: torch.Tensor, hint: str, *, transpose: bool = False, dtype: type | None = None) -> str:
        """A model parameter as an initializer in the compute dtype (or `dtype`); 2-D weights optionally transposed."""
        t = tensor.detach().to("cpu", torch.float32)
        if transpose:
            t = t.t()
        arr = np.ascontiguousarray(t.numpy()).astype(dtype or self.compute_dtype)
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    # ---- nodes ---------------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        hint: str | None = None,
        n_out: int = 1,
        domain: str = "",
        outputs: Sequence[str] | None = None,
        **attrs,
    ) -> str:
        """Add one node; returns its first output name (see `op_multi` for several)."""
        return self.op_multi(op_type, inputs, hint=hint, n_out=n_out, domain=domain, outputs=outputs, **attrs)[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        hint: str | None = None,
        n_out: int = 1,
        domain: str = "",
        outputs: Sequence[str] | None = None,
        **attrs,
    ) -> list[str]:
        """Add one node with `n_out` outputs (or the given output names; "" omits an optional output)."""
        base = hint or op_type.lower()
        if outputs is None:
            outputs = [self.name(base if n_out == 1 else f"{base}_out{k}") for k in range(n_out)]
        node = helper.make_node(
            op_type, list(inputs), list(outputs), name=self.name(f"n_{base}"), domain=domain, **attrs
        )
        self.nodes.append(node)
        return list(outputs)

    def annotate(self, name: str, elem_type: int, shape: Sequence[int | str | None]) -> None:
        """Record the type/shape of an intermediate tensor (helps shape inference past custom ops)."""
        self.value_info.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    # ---- graph I/O -------------------------------------------------------------------------
    def add_input(self, name: str, elem_type: int, shape: Sequence[int | str | None]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        self._used[name] = self._used.get(name, 0) + 1
        return name

    def add_output(self, name: str, elem_type: int, shape: Sequence[int | str | None]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def build(self, graph_name: str, opsets: dict[str, int], *, ir_version: int = 10) -> onnx.ModelProto:
        """Assemble the model (IR `ir_version`, the given opset imports)."""
        graph = helper.make_graph(
            self.nodes, graph_name, self.inputs, self.outputs, self.initializers, value_info=self.value_info
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets.items()],
            producer_name="raggedvit",
        )
        model.ir_version = ir_version
        return model
