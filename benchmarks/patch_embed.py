"""Probe: the PatchEmbed kernel (`raggedvit/kernels/_embed_kernel.py`) over launch configs, against the float32
chain ONNX Runtime runs for a ViT's embedding in the fp16-all exports.

    python3 -m benchmarks.patch_embed [--out benchmarks/results]

Shapes: deit_base (N = 768) and deit_small (N = 384) at 224 (p = 16, P = 1), B = 1, 4, 32, 128. Peer ("chain"):
the same ops as the exported graph in torch, float32 with TF32 matmuls: Reshape / Transpose (a contiguous copy,
the im2col) / MatMul / Concat with the class row / Add of the position table / Cast to float16. Times are CUDA-graph
replays (benchmarks.kernel.graph_time_us). Each config is checked against the float64 reference first (max |error|
and float16 ulps of the result). Writes patch_embed_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._embed_kernel import EmbedConfig, embed_config
from raggedvit.kernels.patch_embed import _launch_patch_embed, patch_embed_reference

MODELS = {"deit_base": 768, "deit_small": 384}
BATCHES = (1, 4, 32, 128)
CONFIGS = (
    EmbedConfig(32, 64, 64, 4, 3),
    EmbedConfig(64, 64, 64, 4, 3),
    EmbedConfig(64, 128, 64, 4, 3),
    EmbedConfig(128, 64, 64, 4, 3),
    EmbedConfig(128, 128, 64, 8, 3),
    EmbedConfig(128, 128, 32, 8, 4),
    EmbedConfig(128, 256, 64, 8, 3),
    EmbedConfig(64, 256, 64, 8, 3),
)


def _case(model: str, N: int, B: int) -> list[dict[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(B * 7 + N)
    p, C, S = 16, 3, 224
    K, L = C * p * p, (S // p) ** 2
    img = torch.randn(B, C, S, S, device="cuda", generator=g)
    w32 = torch.randn(K, N, device="cuda", generator=g) * 0.02
    w = w32.half()
    cls = torch.randn(1, N, device="cuda", generator=g)
    pos = torch.randn(1 + L, N, device="cuda", generator=g)
    ref = patch_embed_reference(img, w, cls, pos, p, compute_dtype=torch.float64)
    ulp = torch.finfo(torch.float16).eps * ref.abs().clamp_min(2**-14)
    base = {"model": model, "B": B, "N": N, "K": K, "rows": B * L}
    recs: list[dict[str, Any]] = []

    def chain() -> torch.Tensor:
        x = img.reshape(B, C, S // p, p, S // p, p).permute(0, 2, 4, 1, 3, 5).contiguous().reshape(B, L, K)
        x = torch.cat([cls.expand(B, 1, N), x @ w32], dim=1) + pos
        return x.half()

    torch.backends.cuda.matmul.allow_tf32 = True
    us, note = graph_time_us(chain)
    recs.append({**base, "impl": "chain_fp32_tf32", "gpu_us": us, "note": note})
    shipped = embed_config(B * L)
    for cfg in (shipped, *[c for c in CONFIGS if c != shipped]):
        name = "shipped" if cfg == shipped else "kernel"
        try:
            out = _launch_patch_embed(img, w, cls, pos, p, config=cfg)
            torch.cuda.synchronize()
            err = (out.double() - ref).abs()
            us, note = graph_time_us(lambda c=cfg: _launch_patch_embed(img, w, cls, pos, p, config=c))
            recs.append({**base, "impl": name, "config": list(vars(cfg).values()), "gpu_us": us, "note": note,
                         "max_abs_err": err.max().item(), "max_ulps": (err / ulp).max().item()})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result too
            recs.append({**base, "impl": name, "config": list(vars(cfg).values()), "error": repr(exc)[:200]})
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "patch_embed")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "patch_embed", "env": environment(), "records": records}
    for model, N in MODELS.items():
        for B in BATCHES:
            recs = _case(model, N, B)
            records += recs
            ok = sorted(
                (r for r in recs if "gpu_us" in r and r["impl"] != "chain_fp32_tf32"), key=lambda r: r["gpu_us"]
            )
            chain = next(r["gpu_us"] for r in recs if r["impl"] == "chain_fp32_tf32")
            shipped = next((r for r in recs if r["impl"] == "shipped" and "gpu_us" in r), None)
            best = " ".join(f"{r['config']}={r['gpu_us']:.1f}" for r in ok[:3])
            sh = f"{shipped['gpu_us']:.1f} (ulps {shipped['max_ulps']:.2f})" if shipped else "error"
            print(f"{model} B={B}: chain={chain:.1f} shipped={sh} | best {best} us", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
