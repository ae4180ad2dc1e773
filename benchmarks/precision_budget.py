#!/usr/bin/env python3
"""Where the fp16 error of a pruned ViT comes from: a float64 emulation with fp16 rounding at chosen points.

    python3 -m benchmarks.precision_budget [--model deit_base_patch16_224] [--sharpen 4,1] [--out benchmarks/results]

The packed forward of a timm ViT (topk-l2, keep 0.5 at block 4) runs in float64 on CPU; each configuration
rounds chosen tensors to fp16 (x.half().double()): the weights, inputs or outputs of the block GEMMs (qkv, proj,
fc1, fc2), the attention's probabilities and output (as a flash kernel does: P in fp16, fp32 sums), the residual
stream and its LayerNorms (fp16-all), the patch embedding's inputs (TF32 / fp16). Every image keeps the tokens
the exact run kept, so only arithmetic differs. Reported: max |Δlogit| per image against the exact run.
This is an analysis of number formats, not a measurement of any runtime; tensor-core accumulation order is not
modelled (fp32 sums of fp16 products are exact in float64 here).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess

import torch
import torch.nn.functional as F

from benchmarks.env import result_path

GEMMS = ("qkv", "proj", "fc1", "fc2")
ALL = frozenset(GEMMS + ("attn",))
# name -> (rounded GEMMs/attention, which GEMM operands are rounded, fp16 stream + LN, rounded patch embedding)
CONFIGS: dict[str, tuple[frozenset[str], str, bool, bool]] = {
    "fp16 recipe (fp32 stream)": (ALL, "wao", False, True),
    "fp16-all (fp16 stream)": (ALL, "wao", True, True),
    "GEMM weights only": (frozenset(GEMMS), "w", False, False),
    "GEMM inputs only": (frozenset(GEMMS), "a", False, False),
    "GEMM outputs only": (frozenset(GEMMS), "o", False, False),
    "qkv only": (frozenset({"qkv"}), "wao", False, False),
    "proj only": (frozenset({"proj"}), "wao", False, False),
    "fc1 (+GELU out) only": (frozenset({"fc1"}), "wao", False, False),
    "fc2 only": (frozenset({"fc2"}), "wao", False, False),
    "attention P and output only": (frozenset({"attn"}), "", False, False),
    "fp32 qkv + attention + proj, fp16 MLP": (frozenset({"fc1", "fc2"}), "wao", False, True),
}


def _r(x: torch.Tensor, on: bool) -> torch.Tensor:
    return x.half().double() if on else x


class Emulator:
    """The packed forward of one image in float64 with fp16 rounding switches."""

    def __init__(self, vit: torch.nn.Module, prune_at: int = 4, keep: float = 0.5) -> None:
        self.w = {k: v.detach().double() for k, v in vit.state_dict().items()}
        self.depth = len(vit.blocks)
        self.heads = vit.blocks[0].attn.num_heads
        self.patch = int(vit.patch_embed.patch_size[0])
        self.prune_at, self.keep = prune_at, keep

    def _ln(self, x: torch.Tensor, name: str, r16: bool) -> torch.Tensor:
        y = F.layer_norm(_r(x, r16), x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"], 1e-6)
        return _r(y, r16)

    def _gemm(self, x: torch.Tensor, name: str, on: bool, operands: str) -> torch.Tensor:
        """x [T, in] @ W^T + b with the chosen operands rounded (output rounded before and after the bias)."""
        y = _r(x, on and "a" in operands) @ _r(self.w[name + ".weight"], on and "w" in operands).T
        y = _r(y, on and "o" in operands) + self.w[name + ".bias"]
        return _r(y, on and "o" in operands)

    def _attn(self, qkv: torch.Tensor, on: bool) -> torch.Tensor:
        n, c3 = qkv.shape
        c = c3 // 3
        q, k, v = qkv.view(n, 3, self.heads, c // self.heads).permute(1, 2, 0, 3)
        s = (q @ k.transpose(-1, -2)) * (c // self.heads) ** -0.5
        e = torch.exp(s - s.amax(-1, keepdim=True))
        o = (_r(e, on) @ v) / e.sum(-1, keepdim=True)
        return _r(o.permute(1, 0, 2).reshape(n, c), on)

    def forward(self, img: torch.Tensor, cfg: tuple, kept: torch.Tensor | None = None):
        """img [3, S, S] float64 -> (logits [classes], kept rows [n]) for one CONFIGS entry."""
        rounded, operands, s16, embed16 = cfg
        w = self.w
        t = F.conv2d(_r(img[None], embed16), _r(w["patch_embed.proj.weight"], embed16), w["patch_embed.proj.bias"],
                     stride=self.patch)  # fmt: skip
        t = torch.cat([w["cls_token"][0], t.flatten(2).transpose(1, 2)[0]], 0) + w["pos_embed"][0]
        x = _r(t, s16)
        for i in range(self.depth):
            if i == self.prune_at:
                if kept is None:
                    k = int(torch.ceil(torch.tensor((x.shape[0] - 1) * self.keep)))
                    idx = torch.sort(torch.topk(x[1:].norm(dim=-1), k).indices).values + 1
                    kept = torch.cat([torch.zeros(1, dtype=torch.long), idx])
                x = x[kept]
            p = f"blocks.{i}."
            qkv = self._gemm(self._ln(x, p + "norm1", s16), p + "attn.qkv", "qkv" in rounded, operands)
            o = self._attn(qkv, "attn" in rounded)
            x = _r(x + self._gemm(o, p + "attn.proj", "proj" in rounded, operands), s16)
            a = self._gemm(self._ln(x, p + "norm2", s16), p + "mlp.fc1", "fc1" in rounded, operands)
            a = _r(F.gelu(a), "fc1" in rounded and "o" in operands)
            x = _r(x + self._gemm(a, p + "mlp.fc2", "fc2" in rounded, operands), s16)
        f = F.layer_norm(x[:1], x.shape[-1:], w["norm.weight"], w["norm.bias"], 1e-6)
        return (f @ w["head.weight"].T + w["head.bias"])[0], kept


def run(model: str, sharpen: float, configs: dict[str, tuple]) -> dict:
    from raggedvit.images import preprocess, sample_images
    from raggedvit.weights import load_vit

    vit, _ = load_vit(model, seed=0, sharpen_qk=sharpen)
    pairs = sample_images()
    images = preprocess(pairs, vit).double()
    emu = Emulator(vit)
    exact = [emu.forward(img, (frozenset(), "", False, False)) for img in images]
    out = {"model": model, "seed": 0, "sharpen_qk": sharpen, "images": [n for n, _ in pairs],
           "reference_max_abs_logit": max(float(lg.abs().max()) for lg, _ in exact), "configs": {}}  # fmt: skip
    for name, cfg in configs.items():
        errs = [float((emu.forward(img, cfg, kept)[0] - lg).abs().max()) for img, (lg, kept) in zip(images, exact)]
        out["configs"][name] = {"max_abs_diff": errs, "max": max(errs)}
        print(f"sharpen {sharpen:g} {name:40s} max {max(errs):.2e}  " + " ".join(f"{e:.1e}" for e in errs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="deit_base_patch16_224")
    ap.add_argument("--sharpen", default="4,1", help="q/k sharpening factors of the seeded weights")
    ap.add_argument("--configs", default=None, help="';'-separated subset of the configuration names")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    configs = CONFIGS if args.configs is None else {k: CONFIGS[k] for k in args.configs.split(";")}
    results = [run(args.model, float(s), configs) for s in args.sharpen.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    date = dt.date.today().isoformat()
    doc = {"kind": "fp16 precision budget, float64 CPU emulation (not a runtime measurement)", "date": date,
           "torch": torch.__version__, "python": platform.python_version(), "raggedvit_commit": commit,
           "policy": "topk-l2 keep 0.5 at block 4", "results": results}  # fmt: skip
    out = result_path(args.out, "precision_budget", "cpu")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
