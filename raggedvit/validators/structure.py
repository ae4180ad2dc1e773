"""The structural check beside the numerical one: the export's numeric attributes against the reference's modules.

Some export faults move the outputs by less than fp16 rounding does (a LayerNorm epsilon of 1e-4 where timm uses
1e-6 drifts half the fp16 floor), but every one of them is written in the graph. This module reads, per block,
the attributes of the nodes the exporter emits and compares them with the reference model's modules:

- norm epsilons: LayerNormalization, com.microsoft SkipLayerNormalization, com.raggedvit GatherLayerNorm (and the
  simplified / RMS norms) by their `epsilon` attribute; an RmsNorm that torch.onnx decomposed by the constant of
  Add(ReduceMean(Pow(x, 2)), eps). Each must be the epsilon of a norm module of its block (LayerNorm, RmsNorm).
- attention: com.raggedvit RaggedAttention's num_heads and scale against the block's attention module, and
  RaggedMerge's num_heads (the heads its key metric averages over: tome) against the same module.
- GELU flavour: Gelu(approximate), BiasGelu (erf), FastGelu (tanh), RaggedLinear(activation=1) (erf) against the
  block's activation modules (nn.GELU and its approximate, timm's GELU / GELUTanh).
- LayerScale presence: each of the block's LayerScale gammas (timm's LayerScale, or gamma_1 / gamma_2) must be
  the constant of a Mul of its own in the block (the values, to the constant's float16 or float32 rounding).
- patch size and stride: PatchEmbed's patch, the kernel and stride of a Conv, or the patch of the im2col Reshape /
  Transpose (0, 2, 4, 1, 3, 5) against the reference's patch embedding.

Nodes belong to blocks by data flow: the exporter names each block's output tensor (recipe "block_outputs"); a
node is in block b when the latest block output it depends on is block b - 1's (block 0: none; the head: the last
block's). A norm node that produces a block's output (the SkipLayerNormalization / GatherLayerNorm that fuses the
residual add with the next norm) normalises for the next block, and its outputs count as the next block's.
Without block outputs in the recipe (older exports) every node is compared with the whole model's modules.
Only what is found is compared: a block with no node of a kind (an attention the exporter did not emit as
RaggedAttention, a norm it decomposed otherwise) checks nothing of that kind, which the report counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

if TYPE_CHECKING:
    from torch import nn

__all__ = ["StructureCheck", "StructureReport", "check_structure", "graph_facts", "reference_facts"]

# op type -> default epsilon (ONNX, ONNX Runtime's contrib ops, raggedvit's GatherLayerNorm)
_NORM_OPS = {
    "LayerNormalization": 1e-5,
    "SkipLayerNormalization": 1e-12,
    "GatherLayerNorm": 1e-5,
    "SimplifiedLayerNormalization": 1e-5,
    "SkipSimplifiedLayerNormalization": 1e-12,
    "RMSNormalization": 1e-5,
}
_PATCH_PERM = [0, 2, 4, 1, 3, 5]  # the im2col of a non-overlapping patch embedding (exporter/rules/embedding.py)
_SCALE_RTOL = 1e-6  # attention scale: a float32 attribute of the module's float
_GAMMA_RTOL = 2e-3  # LayerScale gamma: the constant may be float16 (relative rounding 2^-11)
HEAD = "the head"
MODEL = "the model"
PATCH = "the patch embedding"


@dataclass(frozen=True)
class StructureCheck:
    """One compared attribute: `where` ("block 3", "the head", "the patch embedding", "the model"), `attribute`
    ("norm epsilon", "attention heads", "attention scale", "merge heads", "GELU", "LayerScale", "patch size",
    "patch stride"),
    the export's value and the reference's (text), and whether they agree."""

    where: str
    attribute: str
    export: str
    reference: str
    ok: bool

    def text(self) -> str:
        if self.attribute == "LayerScale":
            return f"{self.where}: LayerScale {self.reference} of the reference: {self.export} in the export"
        return f"{self.where}: {self.attribute} {self.export} in the export, {self.reference} in the reference"


@dataclass
class StructureReport:
    """Every check of one export (check_structure) and what could not be checked (`notes`)."""

    checks: list[StructureCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> list[StructureCheck]:
        return [c for c in self.checks if not c.ok]

    def counts(self) -> dict[str, int]:
        """Checks per attribute."""
        out: dict[str, int] = {}
        for c in self.checks:
            out[c.attribute] = out.get(c.attribute, 0) + 1
        return out

    def summary(self) -> str:
        """One line: what was compared and whether it agrees."""
        what = ", ".join(f"{k} {v}" for k, v in self.counts().items()) or "nothing found to compare"
        bad = self.mismatches
        verdict = "all match" if not bad else f"{len(bad)} mismatch{'es' if len(bad) != 1 else ''}"
        return f"{len(self.checks)} attributes checked ({what}): {verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "counts": self.counts(),
            "mismatches": [asdict(c) for c in self.mismatches],
            "checks": [asdict(c) for c in self.checks],
            "notes": list(self.notes),
        }


@dataclass
class _Facts:
    """What one group (a block, the head, or the whole model) holds: norm epsilons (value, numpy dtype of where it
    is stored), attention (num_heads, scale), GELU flavours ("erf", "tanh", "quick"), LayerScale gammas (graph:
    every Mul constant that could be one; reference: each gamma by name)."""

    eps: list[tuple[float, Any]] = field(default_factory=list)
    attention: list[tuple[int, float]] = field(default_factory=list)
    merge_heads: list[int] = field(default_factory=list)
    gelu: list[str] = field(default_factory=list)
    gammas: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Patch:
    size: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    how: str = ""


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _groups(model: onnx.ModelProto, block_outputs: list[str]) -> list[int | None]:
    """Per node, its group: the block index (0..depth-1), depth for the head, or None without block outputs."""
    if not block_outputs:
        return [None] * len(model.graph.node)
    block_of = {name: b for b, name in enumerate(block_outputs)}
    level: dict[str, int] = {}
    out = []
    for n in model.graph.node:
        g = max((level.get(i, 0) for i in n.input if i), default=0)
        produced = [block_of[o] for o in n.output if o in block_of]
        if produced:  # the node writes block b's output: its other outputs (a fused next norm) are block b + 1's
            nxt = max(produced) + 1
            if n.op_type in _NORM_OPS:
                g = nxt
            for o in n.output:
                level[o] = nxt
        else:
            for o in n.output:
                level[o] = g
        out.append(g)
    return out


def _rms_eps(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray]):
    """The epsilon of a decomposed RmsNorm, Add(ReduceMean(Pow(x, 2) | Mul(x, x)), eps), else None."""
    if node.op_type != "Add" or len(node.input) != 2:
        return None
    for mean_in, eps_in in (node.input, node.input[::-1]):
        c = consts.get(eps_in)
        mean = producers.get(mean_in)
        if c is None or c.size != 1 or mean is None or mean.op_type != "ReduceMean":
            continue
        sq = producers.get(mean.input[0])
        if sq is None:
            continue
        if sq.op_type == "Pow" and float(np.asarray(consts.get(sq.input[1], np.nan)).ravel()[0]) == 2.0:
            return float(c.ravel()[0]), c.dtype
        if sq.op_type == "Mul" and len(sq.input) == 2 and sq.input[0] == sq.input[1]:
            return float(c.ravel()[0]), c.dtype
    return None


def _gelu(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    if node.op_type == "Gelu":
        approx = attrs.get("approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else str(approx)
        return "tanh" if approx == "tanh" else "erf"
    if node.op_type == "BiasGelu":
        return "erf"
    if node.op_type == "FastGelu":
        return "tanh"
    if node.op_type == "RaggedLinear" and int(attrs.get("activation", 0)) == 1:
        return "erf"
    return None


def _default_scale(widths: dict[str, int], node: onnx.NodeProto, heads: int) -> float:
    """RaggedAttention's scale when the node omits it: the op's default 1/sqrt(D), D = qkv width / (3 heads) (DESIGN
    section 3); NaN when the qkv width is not recorded."""
    width = widths.get(node.input[0], 0)
    return 1.0 / math.sqrt(width // (3 * heads)) if width and heads and width % (3 * heads) == 0 else float("nan")


def graph_facts(model: onnx.ModelProto, block_outputs: list[str]) -> tuple[dict[int | None, _Facts], _Patch]:
    """The export's attributes per group (see `_groups`) and its patch embedding."""
    consts = _constants(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    widths = {  # the static last dimension of every value the model records a shape for
        v.name: v.type.tensor_type.shape.dim[-1].dim_value
        for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)
        if v.type.tensor_type.shape.dim and v.type.tensor_type.shape.dim[-1].HasField("dim_value")
    }
    facts: dict[int | None, _Facts] = {}
    patch = _Patch()
    for n, g in zip(model.graph.node, _groups(model, block_outputs)):
        f = facts.setdefault(g, _Facts())
        attrs = _attrs(n)
        if n.op_type in _NORM_OPS:
            f.eps.append((float(attrs.get("epsilon", _NORM_OPS[n.op_type])), np.float32))
        elif (rms := _rms_eps(n, producers, consts)) is not None:
            f.eps.append(rms)
        elif n.op_type == "RaggedAttention":
            heads = int(attrs["num_heads"])
            f.attention.append((heads, float(attrs["scale"]) if "scale" in attrs else _default_scale(widths, n, heads)))
        elif n.op_type == "RaggedMerge":
            f.merge_heads.append(int(attrs["num_heads"]))
        elif n.op_type == "Mul":
            for i in n.input:
                c = consts.get(i)
                if c is not None and c.size > 1 and np.squeeze(c).ndim == 1 and c.dtype.kind == "f":
                    f.gammas[f"{i}#{len(f.gammas)}"] = np.squeeze(c).astype(np.float32)
        elif n.op_type == "PatchEmbed" and patch.size is None:
            p = int(attrs["patch"])
            patch = _Patch((p, p), (p, p), "PatchEmbed")
        elif n.op_type == "Conv" and patch.size is None and g in (None, 0):
            k, s = attrs.get("kernel_shape"), attrs.get("strides", [1, 1])
            if k is not None and len(k) == 2:
                patch = _Patch((int(k[0]), int(k[1])), (int(s[0]), int(s[1])), "Conv")
        elif n.op_type == "Transpose" and patch.size is None and list(attrs.get("perm", [])) == _PATCH_PERM:
            view = producers.get(n.input[0])
            shape = consts.get(view.input[1]) if view is not None and view.op_type == "Reshape" else None
            if shape is not None and shape.size == 6:
                p = (int(shape[3]), int(shape[5]))
                patch = _Patch(p, p, "im2col Reshape / Transpose")
        if (flavour := _gelu(n, attrs)) is not None:
            f.gelu.append(flavour)
    return facts, patch


def _is_norm(m: nn.Module) -> bool:
    name = type(m).__name__
    return isinstance(getattr(m, "eps", None), float) and any(k in name for k in ("LayerNorm", "RmsNorm", "RMSNorm"))


def _gelu_flavour(m: nn.Module) -> str | None:
    from torch import nn

    name = type(m).__name__
    if isinstance(m, nn.GELU):
        return "tanh" if m.approximate == "tanh" else "erf"
    if name == "GELUTanh":
        return "tanh"
    if name == "QuickGELU":
        return "quick"
    if name == "GELU":
        return "erf"
    return None


def _collect(modules: Iterable[tuple[str, nn.Module]], facts: _Facts, *, kinds: str = "all") -> None:
    """Add the modules' attributes to `facts`; kinds "norms": norm epsilons and GELU flavours only."""
    from torch import nn

    for name, m in modules:
        if _is_norm(m):
            facts.eps.append((float(m.eps), None))
        if (flavour := _gelu_flavour(m)) is not None:
            facts.gelu.append(flavour)
        if kinds == "norms":
            continue
        if type(m).__name__ == "LayerScale" and isinstance(getattr(m, "gamma", None), nn.Parameter):
            facts.gammas[f"{name}.gamma"] = m.gamma.detach().float().numpy().ravel()
        for attr in ("gamma_1", "gamma_2"):
            v = getattr(m, attr, None)
            if isinstance(v, nn.Parameter):
                facts.gammas[f"{name}.{attr}" if name else attr] = v.detach().float().numpy().ravel()
        heads, scale = getattr(m, "num_heads", None), getattr(m, "scale", None)
        if isinstance(heads, int) and isinstance(scale, float):
            facts.attention.append((heads, scale))


def reference_facts(
    vit: nn.Module, by_block: bool, stage_modules: dict[int, nn.Module] | None = None
) -> tuple[dict[int | None, _Facts], _Patch]:
    """The reference's attributes per group: block b's modules for block b (block 0 also gets the norm epsilons and
    GELU flavours of the modules outside the blocks, which holds the ones that run before them, as norm_pre), every
    module outside the blocks for the head; one group None of every module when not `by_block`. stage_modules: per
    block b, a pruning stage's module that runs in b's group (its norms and GELUs join b's)."""
    from torch import nn

    from raggedvit.pruning import backbone_for

    blocks = list(backbone_for(vit).blocks)
    inside = {id(m) for blk in blocks for m in blk.modules()}
    outside = [(n, m) for n, m in vit.named_modules() if id(m) not in inside]
    facts: dict[int | None, _Facts] = {}
    if by_block:
        for b, blk in enumerate(blocks):
            named = [(f"blocks.{b}.{n}" if n else f"blocks.{b}", m) for n, m in blk.named_modules()]
            _collect(named, facts.setdefault(b, _Facts()))
        if blocks:
            _collect(outside, facts[0], kinds="norms")
        _collect(outside, facts.setdefault(len(blocks), _Facts()))
        for b, module in (stage_modules or {}).items():
            _collect(module.named_modules(), facts.setdefault(b, _Facts()), kinds="norms")
    else:
        _collect(vit.named_modules(), facts.setdefault(None, _Facts()))
        for module in (stage_modules or {}).values():
            _collect(module.named_modules(), facts[None], kinds="norms")
    pe = getattr(vit, "patch_embed", None)
    proj = getattr(pe, "proj", None)
    patch = _Patch()
    if isinstance(proj, nn.Conv2d):
        patch = _Patch(tuple(int(v) for v in proj.kernel_size), tuple(int(v) for v in proj.stride), "Conv2d")
    return facts, patch


def _where(group: int | None, depth: int) -> str:
    if group is None:
        return MODEL
    return HEAD if group >= depth else f"block {group}"


def _fmt(values: Iterable[float]) -> str:
    vals = sorted(set(values))
    return " / ".join(f"{v:.3g}" for v in vals) if vals else "none"


def _eps_match(value: float, dtype: Any, ref: list[tuple[float, Any]]) -> bool:
    """The export's epsilon equals a reference epsilon stored in the export's dtype (float32 attributes, or the
    constant's dtype of a decomposed norm)."""
    dt = np.dtype(dtype or np.float32)
    return any(np.asarray(r, dtype=dt) == np.asarray(value, dtype=dt) for r, _ in ref)


def check_structure(
    model: onnx.ModelProto,
    vit: nn.Module,
    block_outputs: list[str] | None,
    stage_modules: dict[int, nn.Module] | None = None,
) -> StructureReport:
    """Compare the export `model` (with its initializers) with the reference `vit`; block_outputs: the recipe's
    "block_outputs" (per block, its output tensor's name), None or [] for exports without them; stage_modules: per
    block, the module of the pruning stage that runs in its group (PrunedViT.scorers: DynamicViT's predictor before
    block b has its own LayerNorm and GELUs)."""
    names = list(block_outputs or [])
    got, got_patch = graph_facts(model, names)
    ref, ref_patch = reference_facts(vit, by_block=bool(names), stage_modules=stage_modules)
    depth = len(names)
    report = StructureReport()
    if not names:
        report.notes.append("the recipe names no block outputs: each attribute is compared with the whole model's")
    for g in sorted(got, key=lambda v: -1 if v is None else v):
        f, r = got[g], ref.get(g, _Facts())
        where = _where(g, depth)
        seen: set[tuple[float, str]] = set()
        for value, dtype in f.eps:
            key = (value, np.dtype(dtype).name)
            if key in seen:
                continue
            seen.add(key)
            ok = _eps_match(value, dtype, r.eps)
            report.checks.append(StructureCheck(where, "norm epsilon", f"{value:.3g}", _fmt(e for e, _ in r.eps), ok))
        if f.attention and not r.attention:
            report.notes.append(f"{where}: RaggedAttention without an attention module in the reference")
        elif f.attention:
            for heads in sorted({h for h, _ in f.attention}):
                ok = heads in {h for h, _ in r.attention}
                ref_heads = " / ".join(str(h) for h in sorted({h for h, _ in r.attention}))
                report.checks.append(StructureCheck(where, "attention heads", str(heads), ref_heads, ok))
            for scale in sorted({s for _, s in f.attention}):
                ok = any(abs(scale - s) <= _SCALE_RTOL * abs(s) for _, s in r.attention)
                report.checks.append(
                    StructureCheck(where, "attention scale", f"{scale:.6g}", _fmt(s for _, s in r.attention), ok)
                )
        ref_heads = {h for h, _ in r.attention}
        for heads in sorted(set(f.merge_heads)):
            text = " / ".join(str(h) for h in sorted(ref_heads)) or "no attention module"
            report.checks.append(StructureCheck(where, "merge heads", str(heads), text, heads in ref_heads))
        for flavour in sorted(set(f.gelu)):
            ok = flavour in r.gelu
            report.checks.append(
                StructureCheck(where, "GELU", flavour, " / ".join(sorted(set(r.gelu))) or "no GELU", ok)
            )
        unused = dict(f.gammas)  # each Mul stands for one gamma (seeded gammas are often equal)
        for name, gamma in r.gammas.items():
            hit = next(
                (k for k, c in unused.items() if c.shape == gamma.shape and np.allclose(c, gamma, rtol=_GAMMA_RTOL)),
                None,
            )
            ok = hit is not None
            unused.pop(hit, None)
            found = "a Mul by it" if ok else "no Mul by it"
            report.checks.append(StructureCheck(where, "LayerScale", found, f"{name} {_shape(gamma)}", ok))
    if ref_patch.size is None or got_patch.size is None:
        why = "no Conv2d patch projection in the reference" if ref_patch.size is None else "not found in the graph"
        report.notes.append(f"{PATCH}: not compared ({why})")
    else:
        pairs = (("patch size", got_patch.size, ref_patch.size), ("patch stride", got_patch.stride, ref_patch.stride))
        for attr, a, b in pairs:
            report.checks.append(StructureCheck(PATCH, attr, _pair(a), _pair(b), a == b))
    return report


def _pair(v: tuple[int, int] | None) -> str:
    return "-" if v is None else (str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}")


def _shape(a: np.ndarray) -> str:
    return f"[{', '.join(str(d) for d in a.shape)}]"
