"""Which timm ViT-like models PrunedViT runs, exports and matches: the model check (`model`, one model in a child
process), the runner (`runner`: listing, children, shards) and the report (`report`: data, merge, Markdown page).

    report = run_coverage("deit_*", depth=2, img_size=224, jobs=4)
    report.write_markdown("docs/coverage.md"); report.write_json("coverage.json")
"""

from __future__ import annotations

from raggedvit.coverage.report import COLUMNS, CoverageReport, merge_reports, parse_shard
from raggedvit.coverage.runner import eta_seconds, list_vit_like, matching_names, run_coverage

__all__ = [
    "COLUMNS",
    "CoverageReport",
    "eta_seconds",
    "list_vit_like",
    "matching_names",
    "merge_reports",
    "parse_shard",
    "run_coverage",
]
