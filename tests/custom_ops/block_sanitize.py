"""RaggedViTBlock on the CUDA EP, for compute-sanitizer: random valid calls over deit_tiny / deit_small / deit_base
block shapes, float and float16 streams, with and without LayerScale and cls_attn, dead rows (GPU, onnxruntime-gpu).

    compute-sanitizer --tool memcheck python3 tests/custom_ops/block_sanitize.py [SEED]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from _block_cases import NAMES, block_model, random_feeds  # noqa: E402

from raggedvit.runtime import create_session  # noqa: E402

_ELEM = {np.float32: "float", np.float16: "float16", np.int64: "int64"}


def main(seed: int) -> int:
    """Runs 36 calls (12 sessions x 3); returns the number of calls."""
    rng = np.random.default_rng(seed)
    calls = 0
    for C, H in ((192, 3), (384, 6), (768, 12)):
        for stream in ("float", "float16"):
            for ls in (False, True):
                lengths = [int(v) for v in rng.integers(0, 120, int(rng.integers(1, 5)))]
                T = sum(lengths) + int(rng.integers(0, 9))
                present = set(NAMES) - (set() if ls else {"ls1", "ls2"})
                feeds = random_feeds(rng, T, C, 4 * C, lengths, stream, "float16", present)
                elems = {k: _ELEM[v.dtype.type] for k, v in feeds.items()}
                cls_attn = bool(rng.integers(0, 2))
                model = block_model(elems, {"num_heads": H, "epsilon": 1e-6, "scale": 0.125}, cls_attn=cls_attn)
                sess = create_session(model, "cuda", disable_cpu_fallback=True)
                for _ in range(3):
                    y = sess.run(None, feeds)[0]
                    if not np.isfinite(y.astype(np.float32)).all():
                        raise SystemExit(f"non-finite y: C={C}, stream {stream}, lengths {lengths}")
                    calls += 1
    return calls


if __name__ == "__main__":
    print(f"sanitized calls: {main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)}")
