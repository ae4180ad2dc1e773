#!/usr/bin/env python3
"""Write a test checkpoint that exercises every bias: seeded timm weights, q/k sharpened, then random biases,
LayerNorm gains/shifts, tokens and LayerScale gammas (raggedvit.weights.perturb_biases_and_norms_).

    python -m tests.support.perturbed_checkpoint deit_base_patch16_224 OUT.safetensors [--seed 0] [--sharpen 4]
    raggedvit export deit_base_patch16_224 --checkpoint OUT.safetensors ... && raggedvit validate ...

Seeded timm weights have every Linear bias and LayerNorm shift at 0 and every gain at 1, so validating exports of
them never shows a dropped or misplaced bias; real checkpoints, which cannot be downloaded here, have them all.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def write_checkpoint(model: str, out: str | Path, *, seed: int = 0, sharpen: float = 4.0, scale: float = 0.1) -> str:
    """Build, perturb and save the checkpoint (.safetensors or .pth by suffix); returns its sha256."""
    from raggedvit.weights import load_vit, perturb_biases_and_norms_, sha256_file

    vit, _ = load_vit(model, seed=seed, sharpen_qk=sharpen)
    perturb_biases_and_norms_(vit, seed=seed, scale=scale)
    state = {k: v.detach().contiguous() for k, v in vit.state_dict().items()}
    out = Path(out)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(out))
    else:
        torch.save(state, out)
    return sha256_file(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sharpen", type=float, default=4.0, help="q/k row scale applied before saving (4)")
    ap.add_argument("--scale", type=float, default=0.1, help="std of the added noise (0.1)")
    args = ap.parse_args()
    sha = write_checkpoint(args.model, args.out, seed=args.seed, sharpen=args.sharpen, scale=args.scale)
    print(f"wrote {args.out} (sha256 {sha[:16]}...)")


if __name__ == "__main__":
    main()
