"""Plain ONNX exports of the unpruned timm ViT: the `ort_fp16` and `ort_fp16_optimized` baselines.

TorchScript exporter (dynamo=False), opset 17, dynamic batch:
  plain (`ort_fp16`): timm's model as it is, exported in the benchmark dtype on the benchmark device
      (images [batch, 3, S, S] and logits in fp16 on CUDA).
  optimized (`ort_fp16_optimized`): a float32 export with timm's fused qkv Linear split into q, k, v Linears and
      eager softmax attention (the same function; the pattern ORT's transformer optimizer fuses into `Attention`),
      then optimizer.optimize_model(model_type="vit") + convert_float_to_float16(keep_io_types=True)
      (images and logits float32, as the raggedvit export).
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import torch
from timm.layers import Attention
from torch import nn

__all__ = ["SplitQKVAttention", "export_fp32", "export_plain", "max_ir_version", "optimized_fp16", "plain_fp16"]

MAX_IR_VERSION = 10  # ORT 1.31 rejects IR version 14


class SplitQKVAttention(nn.Module):
    """timm Attention (no qk_norm, no attn norm) as three Linears + eager softmax; x [B, N, C] -> [B, N, C]."""

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
            raise ValueError("SplitQKVAttention: qk_norm is not supported")
        if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
            raise ValueError("SplitQKVAttention: attention output norm is not supported")
        self.heads, self.dim = attn.num_heads, attn.head_dim
        width = self.heads * self.dim
        w, b = attn.qkv.weight.detach(), attn.qkv.bias
        self.q, self.k, self.v = (nn.Linear(w.shape[1], width, bias=b is not None) for _ in range(3))
        for i, lin in enumerate((self.q, self.k, self.v)):
            lin.weight.data.copy_(w[i * width : (i + 1) * width])
            if b is not None:
                lin.bias.data.copy_(b.detach()[i * width : (i + 1) * width])
        self.inv_scale = 1.0 / float(attn.scale)
        self.proj = attn.proj

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False):
        B, N, _ = x.shape
        q = self.q(x).view(B, N, self.heads, self.dim).permute(0, 2, 1, 3)  # [B, H, N, D]
        k = self.k(x).view(B, N, self.heads, self.dim).permute(0, 2, 1, 3)
        v = self.v(x).view(B, N, self.heads, self.dim).permute(0, 2, 1, 3)
        s = torch.matmul(q, k.transpose(-1, -2)) / self.inv_scale  # [B, H, N, N]
        o = torch.matmul(s.softmax(dim=-1), v)  # [B, H, N, D]
        return self.proj(o.permute(0, 2, 1, 3).reshape(B, N, self.heads * self.dim))


def max_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def _export(model: nn.Module, dummy: torch.Tensor, path: Path) -> Path:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
        )
    model_proto = onnx.load(str(path))
    if model_proto.ir_version > MAX_IR_VERSION:
        onnx.save(max_ir_version(model_proto), str(path))
    return path


def export_plain(vit: nn.Module, path: Path) -> Path:
    """TorchScript export of timm's model as it is, in its current dtype and device (dynamic batch)."""
    p = next(vit.parameters())
    size = tuple(int(s) for s in vit.patch_embed.img_size)
    return _export(vit.eval(), torch.zeros(2, 3, *size, dtype=p.dtype, device=p.device), path)


def export_fp32(vit: nn.Module, path: Path) -> Path:
    """TorchScript ONNX export (opset 17, dynamic batch) of a float32 CPU copy of `vit` with split qkv."""
    model = copy.deepcopy(vit).float().cpu().eval()
    for blk in model.blocks:
        blk.attn = SplitQKVAttention(blk.attn)
    size = tuple(int(s) for s in model.patch_embed.img_size)
    return _export(model, torch.zeros(2, 3, *size), path)


def plain_fp16(fp32_path: Path, out: Path) -> Path:
    """fp32 export -> float16 weights and compute, float32 images/logits."""
    from onnxruntime.transformers import float16

    model = float16.convert_float_to_float16(onnx.load(str(fp32_path)), keep_io_types=True)
    onnx.save(max_ir_version(model), str(out))
    return out


def optimized_fp16(fp32_path: Path, out: Path, *, num_heads: int, hidden_size: int) -> tuple[Path, dict[str, Any]]:
    """ORT transformer optimizer (model_type vit) then float16; returns (path, fused op statistics)."""
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(fp32_path), model_type="vit", num_heads=num_heads, hidden_size=hidden_size)
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.convert_float_to_float16(keep_io_types=True)
    max_ir_version(opt.model)
    opt.save_model_to_file(str(out))
    ops = Counter(n.op_type for n in opt.model.graph.node)
    return out, {"fused": fused, "nodes": sum(ops.values()), "attention_nodes": ops.get("Attention", 0)}
