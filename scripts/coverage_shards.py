"""The coverage sweep of a known model list, in shards (one device call each), and the merge into one report.

    python3 scripts/coverage_shards.py run --models-from OLD.json --shard 0/2 --jobs 15 --out shard0.json
    python3 scripts/coverage_shards.py merge shard0.json shard1.json --md docs/coverage.md --json RESULT.json

`run` checks the ViT-like models listed in a previous coverage JSON (no meta-device listing: that list is the
367 ViT-like timm models of the timm version it names), every `n`-th one from index `i`, each in its own child
process (raggedvit.coverage.run_coverage). `merge` writes one CoverageReport from the shards, in the old order.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raggedvit.coverage import CoverageReport, run_coverage


def _run(args: argparse.Namespace) -> None:
    old = json.loads(Path(args.models_from).read_text())
    index, count = (int(v) for v in args.shard.split("/"))
    rows = [r for r in old["models"] if not (args.failed_only and r.get("runs"))][index::count]
    family = {r["name"]: r.get("family") for r in rows}
    report = run_coverage(
        models=[(r["name"], r.get("kwargs") or {}) for r in rows],
        depth=args.depth,
        img_size=args.img_size,
        jobs=args.jobs,
        timeout_s=args.timeout_s,
        progress=lambda done, total, rec: print(f"[{done}/{total}] {rec['name']}", flush=True),
    )
    for rec in report.models:
        rec["family"] = family.get(rec["name"])
    listed = old["meta"].get("names_listed")
    report.meta.update(
        shard=args.shard, models_from=Path(args.models_from).name, names_listed=listed, failed_only=args.failed_only
    )
    report.write_json(args.out)


def _merge(args: argparse.Namespace) -> None:
    shards = [json.loads(Path(p).read_text()) for p in args.shards]
    models = [m for s in shards for m in s["models"]]
    order = {m["name"]: i for i, m in enumerate(json.loads(Path(args.order_from).read_text())["models"])}
    models.sort(key=lambda m: order.get(m["name"], len(order)))
    meta = dict(shards[0]["meta"])
    meta.pop("shard", None)
    meta.update(
        shards=len(shards),
        wall_s=round(max(s["meta"]["wall_s"] for s in shards), 1),
        jobs=shards[0]["meta"].get("jobs"),
    )
    report = CoverageReport(meta, models, [])
    report.write_markdown(args.md)
    report.write_json(args.json)
    print(json.dumps(report.totals()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--models-from", required=True)
    run.add_argument("--shard", default="0/1", help="i/n: every n-th model from index i")
    run.add_argument("--jobs", type=int, default=1)
    run.add_argument("--failed-only", action="store_true", help="only the models that did not run in the old sweep")
    run.add_argument("--depth", type=int, default=2)
    run.add_argument("--img-size", type=int, default=224)
    run.add_argument("--timeout-s", type=float, default=240.0)
    run.add_argument("--out", required=True)
    merge = sub.add_parser("merge")
    merge.add_argument("shards", nargs="+")
    merge.add_argument("--order-from", required=True, help="the coverage JSON whose model order the table keeps")
    merge.add_argument("--md", required=True)
    merge.add_argument("--json", required=True)
    args = ap.parse_args()
    _run(args) if args.cmd == "run" else _merge(args)


if __name__ == "__main__":
    main()
