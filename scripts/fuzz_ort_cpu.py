"""Seeded fuzz of the com.raggedvit ops on the CPU EP (CI: 10,000 calls, test_fuzz_cpu.py): RaggedAttention,
RaggedLinear, RaggedSelect, BiasGelu, GatherLayerNorm and PatchEmbed (their cases: tests/custom_ops/fuzz/).

    python3 scripts/fuzz_ort_cpu.py --calls 100000 --seed 14
    python3 scripts/fuzz_ort_cpu.py --seed 14 --first 5123 --calls 1      # replay one reported call

Every batch of calls runs in a child process; a crash or hang is reported with the seed and call index.
Prints the summary; exit 1 on any crash or failure. The cases: tests/custom_ops/fuzz/ (test helpers, not in the
wheel: run this from a checkout).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "tests" / "custom_ops"), str(_ROOT)]  # the fuzz package and this checkout's raggedvit
from fuzz.driver import run_fuzz  # noqa: E402


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
