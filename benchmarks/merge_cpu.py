"""tome on ONNX Runtime's CPU EP: the fused merge (one com.raggedvit::RaggedMerge node per merging block) against
the same model with the merge traced from standard ops (the export before the op: ~80 nodes per block), and the
unpruned export, side by side in one run.

    python3 -m benchmarks.merge_cpu [--out benchmarks/results] [--model deit_small_patch16_224] [--r 8]
        [--batches 1,8] [--rounds 5] [--threads N]

Every peer is exported in fp32 from the same seeded weights (q/k rows x4), then timed in turns: each round
measures every peer once per batch (raggedvit.timing.measure: wall time per run, real photos), and a peer's figure
is the median over rounds of its per-round medians, so drift of the host hits all peers alike. Writes
merge_cpu.json under --out (overwritten in place) and prints a table. The traced peer exists only here: it exports
PrunedViT with `packed.merge_tokens` routed through `merge.merge_tokens_reference`, which the exporter traces into
standard ops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import onnx

from benchmarks.env import environment, result_path
from raggedvit.exporter import export_onnx
from raggedvit.images import image_variants, preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.pruning.merge import MergedRows, merge_tokens_reference
from raggedvit.runtime import create_session
from raggedvit.timing import measure
from raggedvit.weights import load_vit

__all__ = ["main", "traced_merge"]

PEERS = ("unpruned", "tome_traced", "tome_fused")


@contextlib.contextmanager
def traced_merge() -> Iterator[None]:
    """Export (and run) PrunedViT with the merge as the torch ops of merge_tokens_reference instead of the op."""
    from raggedvit.pruning import packed

    def merge_tokens(x, keys, size, cu, num_prefix, r, *, class_token=True):
        qkv, bias, heads = keys
        return MergedRows(*merge_tokens_reference(x, qkv, bias, size, cu, heads, num_prefix, r, class_token))

    with mock.patch.object(packed, "merge_tokens", merge_tokens):
        yield


def _export(vit, peer: str, r: int, folder: Path) -> Path:
    spec = PruneSpec("none") if peer == "unpruned" else PruneSpec("tome", r=r)
    path = folder / f"{peer}.onnx"
    with traced_merge() if peer == "tome_traced" else contextlib.nullcontext():
        export_onnx(vit, spec, path, dtype="fp32")
    return path


def _nodes(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    ops = Counter(n.op_type for n in model.graph.node)
    return {"nodes": len(model.graph.node), "RaggedMerge": ops.get("RaggedMerge", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT intra-op threads")
    parser.add_argument("--target-s", type=float, default=1.0, help="seconds of timed runs per peer and round")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    vit, _ = load_vit(args.model, seed=0, img_size=224)
    vit.eval()
    photos = preprocess(image_variants(sample_images(), max(batches)), vit).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {peer: _export(vit, peer, args.r, Path(tmp)) for peer in PEERS}
        graphs = {peer: _nodes(path) for peer, path in paths.items()}
        sessions = {peer: create_session(path, "cpu", intra_op_threads=args.threads) for peer, path in paths.items()}
        outputs = {
            peer: sessions[peer].run(["logits"], {"images": photos[:1]})[0] for peer in PEERS
        }  # the two tome peers agree
        agree = float(np.abs(outputs["tome_fused"] - outputs["tome_traced"]).max())
        per_round: dict[tuple[str, int], list[float]] = {(p, b): [] for p in PEERS for b in batches}
        for _ in range(args.rounds):
            for b in batches:
                feed = {"images": photos[:b]}
                for peer in PEERS:
                    t = measure(lambda s=sessions[peer], f=feed: s.run(["logits"], f), lambda: None,
                                target_s=args.target_s)  # fmt: skip
                    per_round[(peer, b)].append(t.median_ms / 1e3)
    rows = []
    for b in batches:
        ms = {peer: statistics.median(per_round[(peer, b)]) * 1e3 for peer in PEERS}
        rows.append(
            {
                "batch": b,
                "ms": {p: round(v, 3) for p, v in ms.items()},
                "img_per_s": {p: round(b / v * 1e3, 1) for p, v in ms.items()},
                "fused_vs_traced": round(ms["tome_traced"] / ms["tome_fused"], 3),
                "fused_vs_unpruned": round(ms["unpruned"] / ms["tome_fused"], 3),
            }
        )
    record = {
        "benchmark": "merge_cpu",
        "command": "python3 -m benchmarks.merge_cpu " + " ".join(argv if argv is not None else []),
        "model": args.model,
        "r": args.r,
        "threads": args.threads,
        "rounds": args.rounds,
        "graphs": graphs,
        "max_logit_diff_fused_vs_traced": agree,
        "rows": rows,
        "env": environment(),
    }
    path = result_path(args.out, "merge", "cpu")
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.model} tome r={args.r}, fp32, ORT CPU EP, {args.threads} threads -> {path}")
    print(f"nodes: {graphs}")
    for row in rows:
        print(f"B={row['batch']}: ms {row['ms']}  fused/traced speed-up {row['fused_vs_traced']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
