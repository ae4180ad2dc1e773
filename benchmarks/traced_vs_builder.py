"""Issue 11's speed bar: exports from the traced path against the hand-built graph builder's, in one run.

The hand-built exporter is raggedvit as of the last commit that had it (given as a source tree, --builder-src); both
exports are of the same seeded timm weights, run by this checkout's runtime and op library on the same images.
topk-l2 exports run as CUDA graphs (raggedvit.runtime.GraphRunner), cls-mass exports node by node with io binding
(both sessions with the batch fixed). Rounds interleave the variants, so drift hits both alike.

    python3 -m benchmarks.traced_vs_builder --builder-src /tmp/builder --out benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["main"]

POLICIES = {
    "topk-l2": {"policy": "topk-l2", "prune_at": [4], "keep": 0.5, "mass": 0.9, "fuse": False},
    "cls-mass": {"policy": "cls-mass", "prune_at": [3, 6, 9], "keep": 0.5, "mass": 0.9, "fuse": False},
}
_BUILDER_EXPORT = """
import json, sys
from raggedvit.exporter import export_onnx
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit
model, spec, dtype, path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
vit, info = load_vit(model, seed=0)
export_onnx(vit, PruneSpec.from_dict(spec), path, dtype=dtype, recipe={"model": model, "weights": info.to_dict()})
"""


def export_pair(model: str, policy: str, dtype: str, builder_src: Path, out_dir: Path) -> dict[str, Path]:
    """{"builder": path, "traced": path}: the same seeded weights exported by both exporters."""
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.weights import load_vit

    spec = POLICIES[policy]
    paths = {"builder": out_dir / f"builder_{policy}.onnx", "traced": out_dir / f"traced_{policy}.onnx"}
    env = {**os.environ, "PYTHONPATH": f"{builder_src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-c", _BUILDER_EXPORT, model, json.dumps(spec), dtype, str(paths["builder"])]
    subprocess.run(cmd, env=env, check=True, cwd=builder_src)
    vit, info = load_vit(model, seed=0)
    export_onnx(
        vit, PruneSpec.from_dict(spec), paths["traced"], dtype=dtype, recipe={"model": model, "weights": info.to_dict()}
    )
    return paths


class _Run:
    """One export at one batch size, bound to fixed device buffers: run() is the timed call."""

    def __init__(self, path: Path, batch: int, images, graph: bool) -> None:
        import torch

        from raggedvit.exporter.metadata import read_recipe
        from raggedvit.runtime import GraphRunner, bind_tensor, create_session, tf32_for

        recipe = read_recipe(path)
        self.graph = graph
        if graph:
            self.runner = GraphRunner(path, batch)
            self.runner.images.copy_(images)
            torch.cuda.synchronize()
            self.logits, self.counts = self.runner.logits, self.runner.token_counts
            return
        self.session = create_session(path, "cuda", tf32=tf32_for(recipe), batch=batch)
        self.images = images.contiguous()
        stages = len(recipe["prune"]["prune_at"])
        self.logits = torch.empty(batch, 1000, dtype=torch.float32, device=images.device)
        self.counts = torch.empty(batch, stages, dtype=torch.int64, device=images.device)
        self.binding = self.session.io_binding()
        bind_tensor(self.binding, "images", self.images)
        bind_tensor(self.binding, "logits", self.logits, output=True)
        bind_tensor(self.binding, "token_counts", self.counts, output=True)

    def run(self) -> None:
        if self.graph:
            self.runner.replay()
        else:
            self.session.run_with_iobinding(self.binding)


def _time(run: _Run, seconds: float) -> float:
    """Median ms of synchronized runs over about `seconds` (after 3 warm-up runs): raggedvit.timing.measure."""
    import torch

    from raggedvit.timing import measure

    return measure(run.run, torch.cuda.synchronize, target_s=seconds, warmup_s=0.0, min_warmup=3).median_ms


def profile_kernels(run: _Run, forwards: int = 20, top: int = 25) -> dict[str, Any]:
    """CUDA kernels of `forwards` runs (benchmarks.e2e.profile.count_kernels): kernels and GPU microseconds per
    forward, and the `top` kernels by total time."""
    from benchmarks.e2e.profile import count_kernels

    return count_kernels(run.run, forwards=forwards, top=top)


def _node_count(path: Path) -> dict[str, Any]:
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    ops = Counter(n.op_type for n in nodes)
    return {"nodes": len(nodes), "NonZero": ops["NonZero"], "RaggedAttention": ops["RaggedAttention"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builder-src", type=Path, required=True, help="source tree of raggedvit with the graph builder")
    ap.add_argument("--model", default="deit_base_patch16_224")
    ap.add_argument("--dtype", default="fp16-all")
    ap.add_argument("--batches", default="1,4,32,128")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.25, help="timed seconds per variant per round")
    ap.add_argument("--profile-batch", type=int, default=32, help="profile each export's kernels at this batch")
    ap.add_argument("--work", type=Path, default=Path("/tmp/traced_vs_builder"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.env import environment
    from raggedvit.images import sample_inputs, tile
    from raggedvit.weights import load_vit

    args.work.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    vit, _ = load_vit(args.model, seed=0)
    photos = sample_inputs(vit)  # [n, 3, S, S]: the photos, as `raggedvit bench` times them
    del vit
    result: dict[str, Any] = {
        "benchmark": "traced_vs_builder",
        "env": environment(),
        "config": {**{k: str(v) for k, v in vars(args).items()}, "policies": POLICIES, "images": len(photos)},
        "exports": {},
        "results": [],
        "checks": [],
        "profiles": [],
    }
    for policy in POLICIES:
        t0 = time.perf_counter()
        paths = export_pair(args.model, policy, args.dtype, args.builder_src, args.work)
        result["exports"][policy] = {k: {"path": str(p), **_node_count(p)} for k, p in paths.items()}
        print(f"exported {policy} in {time.perf_counter() - t0:.0f} s: {result['exports'][policy]}", flush=True)
        graph = policy == "topk-l2"
        for batch in batches:
            images = tile(photos, batch).cuda()
            runs = {name: _Run(p, batch, images, graph) for name, p in paths.items()}
            for r in runs.values():
                r.run()
            torch.cuda.synchronize()
            a, b = runs["builder"], runs["traced"]
            result["checks"].append(
                {
                    "policy": policy,
                    "batch": batch,
                    "max_abs_logit_diff": float((a.logits - b.logits).abs().max()),
                    "token_counts_equal": bool(torch.equal(a.counts, b.counts)),
                    "mean_tokens": a.counts.float().mean(0).tolist(),
                }
            )
            rounds: dict[str, list[float]] = {name: [] for name in runs}
            for i in range(args.rounds):
                order = list(runs) if i % 2 == 0 else list(reversed(runs))
                for name in order:
                    rounds[name].append(_time(runs[name], args.seconds))
            if batch == args.profile_batch:
                for name, r in runs.items():
                    result["profiles"].append(
                        {"policy": policy, "exporter": name, "batch": batch, **profile_kernels(r)}
                    )
            for name, ms in rounds.items():
                med = statistics.median(ms)
                result["results"].append(
                    {
                        "policy": policy,
                        "exporter": name,
                        "mode": "cuda_graph" if graph else "node_by_node",
                        "batch": batch,
                        "ms": med,
                        "img_s": batch / med * 1e3,
                        "round_ms": ms,
                    }
                )
            del runs
            torch.cuda.empty_cache()
    ratios: dict[str, dict[str, float]] = {}
    for policy in POLICIES:
        ratios[policy] = {}
        for batch in batches:
            got = {r["exporter"]: r["img_s"] for r in result["results"] if (r["policy"], r["batch"]) == (policy, batch)}
            ratios[policy][str(batch)] = got["traced"] / got["builder"]
    result["traced_over_builder"] = ratios
    result["target"] = {"min_ratio": 0.97, "met": all(v >= 0.97 for p in ratios.values() for v in p.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{args.model} {args.dtype}: img/s (traced / builder)")
    for r in result["results"]:
        print(f"  {r['policy']:9s} {r['mode']:13s} B={r['batch']:4d} {r['exporter']:8s} {r['img_s']:10,.0f}")
    for policy, by_batch in ratios.items():
        print(f"  {policy}: " + "  ".join(f"B={b} {v:.3f}x" for b, v in by_batch.items()))
    for p in result["profiles"]:
        print(f"  profile {p['policy']} {p['exporter']} B={p['batch']}: {p['kernels_per_forward']:.0f} kernels, "
              f"{p['gpu_us_per_forward']:.0f} us GPU per forward")  # fmt: skip
        for k in p["top"][:8]:
            print(f"      {k['us_per_forward']:8.1f} us {k['calls_per_forward']:5.1f}x {k['kernel'][:90]}")
    for c in result["checks"]:
        print(f"  check {c['policy']} B={c['batch']}: max|dlogit| {c['max_abs_logit_diff']:.2e}, "
              f"counts equal {c['token_counts_equal']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
