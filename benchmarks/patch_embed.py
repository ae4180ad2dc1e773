"""Probe: the PatchEmbed kernel (`raggedvit/kernels/_embed_kernel.py`) over launch configs, against the float32
chain ONNX Runtime runs for a ViT's embedding in the fp16-all exports.

    python3 -m benchmarks.patch_embed [--out benchmarks/results]

Shapes: deit_base (N = 768) and deit_small (N = 384) at 224 (p = 16, P = 1), B = 1, 4, 32, 128. Peer ("chain"):
the same ops as the exported graph in torch, float32 with TF32 matmuls: Reshape / Transpose (a contiguous copy,
the im2col) / MatMul / Concat with the class row / Add of the position table / Cast to float16. Times are CUDA-graph
replays (benchmarks.kernel.graph_time_us). Each config is checked against the float64 reference first (max |error|
and float16 ulps of the result). Writes patch_embed_<date>_<gpu>.json.

`--const-patch` adds `const` rows: a copy of the kernel (`_patch_embed_const` below, probe only) whose patch size
is a constexpr (16 here), so the pixel offset of each k inside a patch, (k // p^2, k % p^2 // p, k % p), is computed
with constant divisors and the loads of a patch row's p contiguous pixels can be vectorised without hints.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton
import triton.language as tl

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


@triton.jit(do_not_specialize=["B"])
def _patch_embed_const(Img, W, Prefix, Pos, Out, B, C, H, Wd, gw, L, P, N, K, PATCH: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """`_embed_kernel._patch_embed` with the patch size a constexpr."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    M = B * L
    num_m = tl.cdiv(M, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    S = P + L
    if pid_m < num_m:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in = rows < M
        b = rows // L
        tok = rows % L
        py = tok // gw
        px = tok % gw
        row_base = ((b.to(tl.int64) * C) * H + py * PATCH) * Wd + px * PATCH
        PP: tl.constexpr = PATCH * PATCH
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            k_in = k < K
            c = k // PP
            rem = k % PP
            k_off = (c * H + rem // PATCH) * Wd + rem % PATCH
            a = tl.load(Img + row_base[:, None] + k_off[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
            w = tl.load(W + k.to(tl.int64)[:, None] * N + cols[None, :], mask=k_in[:, None] & col_in[None, :],
                        other=0.0)  # fmt: skip
            acc = tl.dot(a.to(tl.float16), w.to(tl.float16), acc)
        keep = row_in[:, None] & col_in[None, :]
        acc += tl.load(Pos + (P + tok).to(tl.int64)[:, None] * N + cols[None, :], mask=keep, other=0.0)
        out_rows = b.to(tl.int64) * S + P + tok
    else:
        rows = (pid_m - num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in = rows < B * P
        j = rows % tl.maximum(P, 1)
        keep = row_in[:, None] & col_in[None, :]
        offs = j.to(tl.int64)[:, None] * N + cols[None, :]
        acc = tl.load(Prefix + offs, mask=keep, other=0.0) + tl.load(Pos + offs, mask=keep, other=0.0)
        out_rows = (rows // tl.maximum(P, 1)).to(tl.int64) * S + j
    tl.store(Out + out_rows[:, None] * N + cols[None, :], acc.to(Out.dtype.element_ty), mask=keep)


def _launch_const(img: torch.Tensor, w: torch.Tensor, cls: torch.Tensor, pos: torch.Tensor, p: int,
                  cfg: EmbedConfig) -> torch.Tensor:  # fmt: skip
    B, C, H, W = img.shape
    P, N = cls.shape
    gw, L = W // p, (H // p) * (W // p)
    out = torch.empty((B, P + L, N), dtype=torch.float16, device=img.device)
    tiles_m = -(-(B * L) // cfg.block_m) + -(-(B * P) // cfg.block_m)
    _patch_embed_const[(tiles_m * -(-N // cfg.block_n),)](
        img, w, cls, pos, out, B, C, H, W, gw, L, P, N, w.shape[0], PATCH=p, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


CONST_CONFIGS = (
    EmbedConfig(128, 128, 64, 8, 3),
    EmbedConfig(128, 128, 64, 8, 4),
    EmbedConfig(64, 128, 64, 4, 3),
    EmbedConfig(128, 64, 64, 4, 3),
    EmbedConfig(128, 256, 64, 8, 3),
    EmbedConfig(32, 64, 64, 4, 3),
)


def _case(model: str, N: int, B: int, const_patch: bool = False) -> list[dict[str, Any]]:
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
    for cfg in CONST_CONFIGS if const_patch else ():
        try:
            out = _launch_const(img, w, cls, pos, p, cfg)
            torch.cuda.synchronize()
            err = (out.double() - ref).abs()
            us, note = graph_time_us(lambda c=cfg: _launch_const(img, w, cls, pos, p, c))
            recs.append({**base, "impl": "const", "config": list(vars(cfg).values()), "gpu_us": us, "note": note,
                         "max_abs_err": err.max().item(), "max_ulps": (err / ulp).max().item()})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recorded
            recs.append({**base, "impl": "const", "config": list(vars(cfg).values()), "error": repr(exc)[:200]})
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--const-patch", action="store_true", help="add the constexpr-patch copy's configs")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    path = probe_result_path(args.out, "patch_embed_const" if args.const_patch else "patch_embed")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "patch_embed", "env": environment(), "records": records}
    for model, N in MODELS.items():
        for B in (int(v) for v in args.batches.split(",")):
            recs = _case(model, N, B, args.const_patch)
            records += recs
            ok = sorted(
                (r for r in recs if "gpu_us" in r and r["impl"] != "chain_fp32_tf32"), key=lambda r: r["gpu_us"]
            )
            chain = next(r["gpu_us"] for r in recs if r["impl"] == "chain_fp32_tf32")
            shipped = next((r for r in recs if r["impl"] == "shipped" and "gpu_us" in r), None)
            best = " ".join(f"{r['impl']}{r['config']}={r['gpu_us']:.1f}" for r in ok[:4])
            sh = f"{shipped['gpu_us']:.1f} (ulps {shipped['max_ulps']:.2f})" if shipped else "error"
            print(f"{model} B={B}: chain={chain:.1f} shipped={sh} | best {best} us", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
