"""A sweep without exports, for tests of what surrounds the measurements: `FakeSpeed` stands in for
raggedvit.sweep.runner.measure_speed (canned numbers, no export, no ONNX Runtime; the accuracy side stays real), and
`python -m tests.support.sweep ARGS...` runs `raggedvit ARGS...` with it, one of its points slowed down:

    SLOW_POINT=K   the K-th point measured (1-based) takes SLOW_S seconds (default 120), spent inside weakref
                   callbacks as torch's export spends time in its WeakKeyDictionaries' callbacks: a signal lands in
                   one, where Python drops the exception its handler raises
    MARKER=PATH    written when the slow point starts
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

__all__ = ["FakeSpeed", "slow_in_finalizers"]


class FakeSpeed:
    """measure_speed without an export: img/s 100 x (1 + stages) + r (a pruned point is faster), counting its calls;
    call number `slow_at` (1-based; 0: none) first spends `slow_s` seconds in slow_in_finalizers, writing `marker`."""

    def __init__(self, *, slow_at: int = 0, slow_s: float = 120.0, marker: str | Path | None = None) -> None:
        self.calls, self.slow_at, self.slow_s, self.marker = 0, slow_at, slow_s, marker

    def __call__(self, vit, spec, inputs, workdir, **kwargs) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.slow_at:
            if self.marker is not None:
                Path(self.marker).write_text(str(self.calls))
            slow_in_finalizers(self.slow_s)
        img_per_s = 100.0 * (1 + len(spec.prune_at)) + spec.r
        ms = 1e3 * kwargs["batch"] / img_per_s
        return {"img_per_s": img_per_s, "latency_ms": ms, "p10_ms": ms, "p90_ms": ms, "gpu_ms": None, "runs": 5,
                "cuda_graph": False}  # fmt: skip


def slow_in_finalizers(seconds: float) -> None:
    """Spend `seconds` almost wholly inside weakref callbacks (each sleeps 50 ms)."""

    class Key:
        pass

    def callback(_ref) -> None:
        time.sleep(0.05)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        key = Key()
        ref = weakref.ref(key, callback)
        del key  # the callback runs here
        del ref


def main() -> None:
    import raggedvit.sweep.runner as runner
    from raggedvit.cli import main as cli

    env = os.environ
    runner.measure_speed = FakeSpeed(
        slow_at=int(env.get("SLOW_POINT", "0")), slow_s=float(env.get("SLOW_S", "120")), marker=env.get("MARKER")
    )
    sys.argv[0] = "raggedvit"
    cli()


if __name__ == "__main__":
    main()
