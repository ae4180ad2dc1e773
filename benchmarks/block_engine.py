"""The block engine's prototype gate: GPU time per ViT block, one persistent launch against today's per-op block.

For deit_base (C=768, H=12, F=3072) and deit_small (C=384, H=6, F=1536) blocks in fp16 (seeded timm weights,
q/k rows of qkv x4 as the exports' seeded weights), at 197 / 99 rows (B=1, unpruned / after a 0.5 keep rate) and
788 / 396 rows (B=4 packed sequences of 197 / 99):
- correctness first: the engine against vit_block_reference (fresh random rows, poisoned output, cls_attn too),
  the same inputs twice (a race shows as a moving result), and a CUDA graph of the engine replayed on new inputs;
- us per block: a chain of BLOCKS distinct blocks (a forward's worth of weights, so weights come from HBM as in
  serving, not from L2) captured as one CUDA graph, GPU time of its replays / BLOCKS (median): the engine, the
  engine with cls_attn, the engine with one block's weights every time (L2-resident), the engine on a layout whose
  rows are all dead (launch and barriers only) and that with its first phase only (the launch), and today's
  per-op block (raggedvit.pruning.packed_block.packed_block_forward on the timm Block) with nn.Linear (cuBLAS) and
  with the ragged linear kernels;
- a sweep of engine configs (sweep_configs) per case, each checked against the reference;
- per phase: each phase of the engine alone (`phases=(p, p + 1)`, a launch of its own), against its roofline
  (weight and activation bytes at HBM_BYTES_PER_S, FLOPs at TENSOR_FLOPS).

    python3 -m benchmarks.block_engine --out benchmarks/results

Writes <out>/block_engine_<GPU name>.json (one canonical file, overwritten) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from raggedvit.kernels._block_kernel import PHASES
from raggedvit.kernels.reference import BlockWeights
from raggedvit.pruning.packed_block import block_weights as packed_block_weights

MODELS = {"deit_base": (768, 12), "deit_small": (384, 6)}  # C, H (F = 4C)
CASES = ((197, 1), (99, 1), (788, 4), (396, 4))  # (rows T, sequences B): B equal sequences of T / B rows
BLOCKS = 12  # distinct blocks per timed chain
HBM_BYTES_PER_S = 4.8e12
TENSOR_FLOPS = 800e12
QK_SHARPEN = 4.0
GATE_SPEEDUP = 2.0
# engine: the block; engine_cls: with cls_attn; engine_l2: one block's weights in every chain step (L2-resident);
# engine_dead: a layout with no live row (launch + barriers); engine_launch: that with the first phase only (launch)
ENGINE_VARIANTS = (
    "engine",
    "engine_cls",
    "engine_l2",
    "engine_dead",
    "engine_launch",
)  # the engine must be this much faster than the faster per-op block at B = 1


def seq_lengths(T: int, B: int) -> list[int]:
    """B sequences of T rows in all (the first T mod B one row longer)."""
    return [T // B + (1 if b < T % B else 0) for b in range(B)]


def phase_costs(C: int, H: int, F: int, lengths: list[int], elem_bytes: int = 2) -> list[dict[str, Any]]:
    """Per phase of the engine: weight bytes, activation bytes (inputs read once, outputs written once), FLOPs,
    and the roofline max(bytes / HBM_BYTES_PER_S, flops / TENSOR_FLOPS) in us."""
    T = sum(lengths)
    e = elem_bytes
    sq = sum(n * n for n in lengths)
    rows = [
        ("norm1", 0, 2 * T * C, 8 * T * C),
        ("qkv", 3 * C * C, T * C + T * 3 * C, 2 * T * C * 3 * C),
        ("attn", 0, T * 3 * C + T * C, 4 * sq * C),
        ("proj", C * C, T * C * 3, 2 * T * C * C),
        ("norm2", 0, 2 * T * C, 8 * T * C),
        ("fc1", F * C, T * C + T * F, 2 * T * C * F),
        ("fc2", C * F, T * F + 2 * T * C, 2 * T * F * C),
    ]
    assert tuple(r[0] for r in rows) == PHASES
    out = []
    for name, weights, acts, flops in rows:
        wb, ab = weights * e, acts * e
        out.append({"phase": name, "weight_bytes": wb, "act_bytes": ab, "flops": flops,
                    "bytes_us": (wb + ab) / HBM_BYTES_PER_S * 1e6, "flops_us": flops / TENSOR_FLOPS * 1e6,
                    "roofline_us": max((wb + ab) / HBM_BYTES_PER_S, flops / TENSOR_FLOPS) * 1e6})  # fmt: skip
    return out


def block_roofline_us(costs: list[dict[str, Any]]) -> float:
    """The whole block's floor: all bytes at HBM bandwidth or all FLOPs at the tensor rate, whichever is larger."""
    nbytes = sum(c["weight_bytes"] + c["act_bytes"] for c in costs)
    return max(nbytes / HBM_BYTES_PER_S, sum(c["flops"] for c in costs) / TENSOR_FLOPS) * 1e6


def result_name(gpu: str) -> str:
    """The canonical result file's name for a GPU name ('NVIDIA H200' -> block_engine_NVIDIA-H200.json)."""
    return f"block_engine_{gpu.strip().replace(' ', '-')}.json"


def best_swept_us(rec: dict[str, Any]) -> float | None:
    """The fastest correct (rel_err < 1e-2) swept config's us per block of a case, or None."""
    ok = [s["us"] for s in rec.get("sweep", []) if s.get("us") and s.get("rel_err", 1.0) < 1e-2]
    return min(ok) if ok else None


def gate(records: list[dict[str, Any]], best: bool = False) -> dict[str, Any]:
    """The prototype gate: at B = 1 (deit_base, 197 and 99 rows) the engine must be GATE_SPEEDUP x faster than the
    faster per-op block (best: the engine under each case's fastest swept config). Returns {passed, speedups {rows:
    x}, reason}."""
    speedups: dict[str, float] = {}
    for r in records:
        if r.get("model") == "deit_base" and r.get("B") == 1 and r.get("T") in (197, 99):
            ops = [r[k] for k in ("per_op_cublas_us", "per_op_ragged_us") if r.get(k)]
            engine = best_swept_us(r) if best else r.get("engine_us")
            if engine and ops:
                speedups[str(r["T"])] = min(ops) / engine
    if set(speedups) != {"197", "99"}:
        return {"passed": False, "speedups": speedups, "reason": "a B = 1 deit_base case is missing"}
    worst = min(speedups.values())
    passed = worst >= GATE_SPEEDUP
    reason = f"worst B=1 speedup {worst:.2f}x {'>=' if passed else '<'} {GATE_SPEEDUP:.1f}x"
    return {"passed": passed, "speedups": speedups, "reason": reason}


def table(records: list[dict[str, Any]]) -> list[str]:
    """The printed summary: per (model, T, B) the block times and speedup, then the phases against their rooflines."""

    def f(v: Any) -> str:
        return f"{v:8.2f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>8}"

    lines = [f"{'model':<11}{'T':>5}{'B':>3} {'engine':>8} {'eng+cls':>8} {'L2 wts':>8} {'dead':>8} {'launch':>8} "
             f"{'cuBLAS':>8} {'ragged':>8} "
             f"{'speedup':>8} {'swept':>8} {'roofline':>8}   us per block"]  # fmt: skip
    for r in records:
        ops = [r[k] for k in ("per_op_cublas_us", "per_op_ragged_us") if r.get(k)]
        sp = min(ops) / r["engine_us"] if ops and r.get("engine_us") else None
        lines.append(f"{r['model']:<11}{r['T']:>5}{r['B']:>3} {f(r.get('engine_us'))} {f(r.get('engine_cls_us'))} "
                     f"{f(r.get('engine_l2_us'))} {f(r.get('engine_dead_us'))} {f(r.get('engine_launch_us'))} "
                     f"{f(r.get('per_op_cublas_us'))} {f(r.get('per_op_ragged_us'))} "
                     f"{f(sp)} {f(best_swept_us(r))} {f(r.get('roofline_us'))}")  # fmt: skip
    lines.append(
        f"{'model':<11}{'T':>5}{'B':>3} " + " ".join(f"{p:>13}" for p in PHASES) + "   phase alone / roofline us"
    )
    for r in records:
        cells = []
        for c in r.get("phases", []):
            cells.append(f"{c.get('alone_us', float('nan')):6.2f}/{c['roofline_us']:<6.2f}")
        lines.append(f"{r['model']:<11}{r['T']:>5}{r['B']:>3} " + " ".join(f"{c:>13}" for c in cells))
    return lines


# ---------------------------------------------------------------- GPU parts
def block_weights(block: Any) -> BlockWeights:
    """BlockWeights of a timm Block in fp16 (the one extraction PrunedViT uses: packed_block.block_weights)."""
    w = packed_block_weights(block, torch.float16)
    if w is None:
        raise ValueError(f"the block op does not take {type(block).__name__} blocks")
    return w


def make_blocks(C: int, H: int, n: int, seed: int) -> list[Any]:
    """n seeded timm Blocks (fp16, CUDA, eval) with q/k rows of qkv sharpened as the exports' seeded weights."""
    from timm.models.vision_transformer import Block

    from raggedvit.weights import sharpen_qk_

    torch.manual_seed(seed)
    blocks = []
    for _ in range(n):
        blk = Block(C, H, mlp_ratio=4.0, qkv_bias=True).eval()
        sharpen_qk_(blk, QK_SHARPEN)
        blocks.append(blk.half().cuda())
    return blocks


def check(blocks: list[Any], H: int, T: int, B: int, gen: torch.Generator) -> dict[str, Any]:
    """The engine against vit_block_reference on fresh inputs: y and cls_attn (fp16 rule), two runs bitwise equal,
    and a CUDA graph of the engine replayed on three new inputs."""
    from raggedvit.kernels.block_engine import vit_block_engine
    from raggedvit.kernels.reference import vit_block_reference
    from tests.support.testing import assert_close, default_tolerance, rel_error

    w = block_weights(blocks[0])
    C = w.norm1_weight.shape[0]
    cu = torch.tensor([0, *torch.tensor(seq_lengths(T, B)).cumsum(0).tolist()], device="cuda")
    rec: dict[str, Any] = {}
    errors = []
    for cu_dtype in (torch.int64, torch.int32):
        x = torch.randn(T, C, generator=gen).half().cuda()
        out = torch.full_like(x, float("nan"))
        y, cls = vit_block_engine(x, cu.to(cu_dtype), w, H, return_cls_attn=True, out=out)
        y2, cls2 = vit_block_engine(x, cu.to(cu_dtype), w, H, return_cls_attn=True)
        ref, ref_cls = vit_block_reference(x, cu, w, H, return_cls_attn=True)
        gold = vit_block_reference(x, cu, w, H, compute_dtype=torch.float64)
        rec[f"rel_err_ref_{cu_dtype}"] = rel_error(y, ref)
        rec[f"rel_err_gold_{cu_dtype}"] = rel_error(y, gold)
        rec[f"rel_err_cls_{cu_dtype}"] = rel_error(cls, ref_cls)
        rec["repeat_equal"] = rec.get("repeat_equal", True) and bool(torch.equal(y, y2) and torch.equal(cls, cls2))
        for a, e, name in ((y, ref, "y"), (cls, ref_cls, "cls_attn")):
            try:  # cls_attn is fp32 but computed from fp16 qkv: the fp16 rule
                assert_close(a, e, rtol=default_tolerance(torch.float16), name=f"{name} (cu {cu_dtype})")
            except AssertionError as exc:
                errors.append(str(exc))
    x_static = torch.randn(T, C, generator=gen).half().cuda()
    y_static = torch.empty_like(x_static)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # twice: the first launch of a kernel runs one program per multiprocessor
        vit_block_engine(x_static, cu, w, H, out=y_static)
        vit_block_engine(x_static, cu, w, H, out=y_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vit_block_engine(x_static, cu, w, H, out=y_static)
    replay_err = 0.0
    for _ in range(3):
        x_static.copy_(torch.randn(T, C, generator=gen).half().cuda())
        y_static.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = vit_block_reference(x_static, cu, w, H)
        replay_err = max(replay_err, rel_error(y_static, ref))
        try:
            assert_close(y_static, ref, name="graph replay y")
        except AssertionError as exc:
            errors.append(str(exc))
    rec["rel_err_graph_replay"] = replay_err
    if not rec["repeat_equal"]:
        errors.append("two runs on the same inputs differ (a race)")
    rec["passed"] = not errors
    rec["errors"] = errors[:4]
    return rec


def chain_fn(
    blocks: list[Any], H: int, T: int, B: int, variant: str, phase: int | None = None, config: Any = None
) -> Callable[[], object]:
    """One call = the BLOCKS blocks in sequence (each block's output is the next one's input)."""
    from raggedvit.kernels.block_engine import block_workspace, vit_block_engine
    from raggedvit.pruning.packed_block import packed_block_forward

    C = blocks[0].norm1.weight.shape[0]
    lengths = seq_lengths(T, B)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    if variant in ("engine_dead", "engine_launch"):  # no live row: launch and barriers (dead), launch alone
        cu = torch.zeros_like(cu)
        phase = 0 if variant == "engine_launch" else phase
    x0 = torch.randn(T, C, device="cuda").half()
    if variant.startswith("per_op"):
        ragged = variant == "per_op_ragged"

        def run_per_op() -> object:
            x = x0
            for blk in blocks:
                x = packed_block_forward(blk, x, cu, max_seqlen=max(lengths), ragged_linear=ragged)
            return x

        return run_per_op
    cls = variant == "engine_cls"
    ws = [block_workspace(T, C, 4 * C, H, torch.float16, torch.float16, x0.device, cls, config) for _ in range(2)]
    ys = [torch.empty_like(x0) for _ in range(2)]
    ws_all = [block_weights(b) for b in blocks]
    if variant == "engine_l2":  # one block's weights every time: they stay in L2
        ws_all = ws_all[:1] * len(ws_all)
    phases = (0, len(PHASES)) if phase is None else (phase, phase + 1)
    if phase is not None and variant != "engine_launch":  # the phase's inputs: the scratch of a whole run
        for i in range(2):
            vit_block_engine(x0, cu, ws_all[i], H, workspace=ws[i], out=ys[i], config=config)

    def run_engine() -> object:
        x = x0
        for i, w in enumerate(ws_all):
            x = vit_block_engine(x if phase is None else x0, cu, w, H, return_cls_attn=cls, workspace=ws[i % 2],
                                 out=ys[i % 2], phases=phases, config=config)  # fmt: skip
            x = x[0] if cls else x
        return x

    return run_engine


def sweep_configs() -> list[dict[str, Any]]:
    """Engine configs (fp16) timed beside the default: field overrides of engine_config(torch.float16)."""
    return [
        {},
        {"m_fast": False},
        {"programs_per_sm": 1},
        {"split_proj": 1, "split_fc2": 1},
        {"bk": 128, "num_stages": 3},
        {"num_warps": 8},
        {"att_bm": 32},
        {"split_fc2": 8, "split_proj": 4},
        {"prefetch": True},
        {"prefetch": True, "bk": 128, "num_stages": 3},
        {"prefetch": True, "bk": 128, "num_stages": 3, "split_fc2": 8, "split_proj": 4},
    ]


def sweep(blocks: list[Any], H: int, T: int, B: int, gen: torch.Generator) -> list[dict[str, Any]]:
    """us per block of the engine under each of sweep_configs(), with its error against the reference."""
    from dataclasses import replace

    from benchmarks.kernel import graph_time_us
    from raggedvit.kernels.block_engine import engine_config, vit_block_engine
    from raggedvit.kernels.reference import vit_block_reference
    from tests.support.testing import rel_error

    out = []
    base = engine_config(torch.float16)
    w = block_weights(blocks[0])
    C = w.norm1_weight.shape[0]
    cu = torch.tensor([0, *torch.tensor(seq_lengths(T, B)).cumsum(0).tolist()], device="cuda")
    for over in sweep_configs():
        cfg = replace(base, **over)
        rec: dict[str, Any] = {"override": over}
        try:
            x = torch.randn(T, C, generator=gen).half().cuda()
            y = vit_block_engine(x, cu, w, H, config=cfg)
            vit_block_engine(x, cu, w, H, config=cfg)  # the second launch runs the kernel's full occupancy
            y = vit_block_engine(x, cu, w, H, config=cfg)
            rec["rel_err"] = rel_error(y, vit_block_reference(x, cu, w, H))
            us, how = graph_time_us(chain_fn(blocks, H, T, B, "engine", config=cfg), inner=2, reps=15)
            rec["us"] = us / BLOCKS
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  sweep {over}: {rec.get('us', rec.get('error'))} (rel_err {rec.get('rel_err')})", flush=True)
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.env import environment
    from benchmarks.kernel import graph_time_us
    from raggedvit.kernels.block_engine import _OCCUPANCY, engine_config, engine_grid

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="deit_base at 197 rows only")
    ap.add_argument("--no-phases", action="store_true", help="skip the per-phase timings")
    ap.add_argument("--no-sweep", action="store_true", help="skip the config sweep (every case)")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    records: list[dict[str, Any]] = []
    models = {"deit_base": MODELS["deit_base"]} if args.quick else MODELS
    cases = CASES[:1] if args.quick else CASES
    path = Path(args.out) / result_name(torch.cuda.get_device_name(0))
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(records: list[dict[str, Any]]) -> dict[str, Any]:
        result = {
            "benchmark": "block_engine",
            "env": environment(),
            "engine": {"sms": engine_grid(torch.device("cuda"), False), "config": vars(engine_config(torch.float16)),
                       "occupancy": {str(k[-1]): v for k, v in _OCCUPANCY.items()}, "blocks_per_chain": BLOCKS,
                       "hbm_bytes_per_s": HBM_BYTES_PER_S, "tensor_flops": TENSOR_FLOPS},
            "gate": gate(records),
            "gate_best_config": gate(records, best=True),
            "records": records,
        }  # fmt: skip
        path.write_text(json.dumps(result, indent=1, default=str))  # after every case: a timeout keeps the rest
        return result

    for model, (C, H) in models.items():
        blocks = make_blocks(C, H, BLOCKS, seed=C)
        for T, B in cases:
            costs = phase_costs(C, H, 4 * C, seq_lengths(T, B))
            rec: dict[str, Any] = {"model": model, "C": C, "H": H, "F": 4 * C, "T": T, "B": B,
                                   "roofline_us": block_roofline_us(costs), "phases": costs}  # fmt: skip
            try:
                rec["check"] = check(blocks, H, T, B, gen)
            except Exception as exc:  # noqa: BLE001 - recorded, the timings still run
                rec["check"] = {"passed": False, "errors": [f"{type(exc).__name__}: {str(exc)[:400]}"]}
            print(f"{model} T={T} B={B} check: {rec['check']}", flush=True)
            for variant in ENGINE_VARIANTS + ("per_op_cublas", "per_op_ragged"):
                try:
                    us, how = graph_time_us(chain_fn(blocks, H, T, B, variant), inner=2, reps=15)
                    rec[f"{variant}_us"] = us / BLOCKS
                    if how:
                        rec[f"{variant}_timing"] = how
                except Exception as exc:  # noqa: BLE001 - recorded, not raised
                    rec[f"{variant}_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                print(f"  {variant}: {rec.get(f'{variant}_us', rec.get(f'{variant}_error'))}", flush=True)
            if not args.no_phases:
                for p, cost in enumerate(costs):
                    try:
                        us, _ = graph_time_us(chain_fn(blocks, H, T, B, "engine", phase=p), inner=2, reps=15)
                        cost["alone_us"] = us / BLOCKS
                    except Exception as exc:  # noqa: BLE001
                        cost["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(f"  phase {cost['phase']}: {cost.get('alone_us', cost.get('error'))}", flush=True)
            if not args.no_sweep:
                rec["sweep"] = sweep(blocks, H, T, B, gen)
            records.append(rec)
            write(records)
        del blocks
        torch.cuda.empty_cache()
    result = write(records)
    print(f"wrote {path}")
    print(f"gate: {result['gate']}")
    print(f"gate with each case's best swept config: {result['gate_best_config']}")
    for line in table(records):
        print(line)


if __name__ == "__main__":
    main()
