"""Seeded fuzz of the com.raggedvit ops on the CPU EP (CI: 10,000 calls, test_fuzz_cpu.py): RaggedAttention,
RaggedLinear, RaggedSelect, BiasGelu, GatherLayerNorm and PatchEmbed (their cases: raggedvit/custom_ops/_fuzz_*.py).

    python3 scripts/fuzz_ort_cpu.py --calls 100000 --seed 14
    python3 scripts/fuzz_ort_cpu.py --seed 14 --first 5123 --calls 1      # replay one reported call

Every batch of calls runs in a child process; a crash or hang is reported with the seed and call index.
Prints the summary; exit 1 on any crash or failure. The cases: raggedvit/custom_ops/_fuzz_cases.py. Needs raggedvit
importable (the editable install of the README, or PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import random
import sys

from raggedvit.custom_ops._fuzz_driver import run_fuzz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000, help="number of calls")
    ap.add_argument("--first", type=int, default=0, help="index of the first call")
    ap.add_argument("--seed", type=int, default=None, help="fuzz seed (default: random, printed)")
    ap.add_argument("--batch", type=int, default=2_500, help="calls per child process")
    ap.add_argument("--jobs", type=int, default=2, help="child processes at a time")
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds after which no new batch starts")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    summary = run_fuzz(seed, args.calls, first=args.first, batch=args.batch, jobs=args.jobs, budget_s=args.budget)
    print(summary.report())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
