"""memcheck_ort_fuzz.py (torch-free) draws a share of its RaggedAttention calls from the row count where the
kernels' large launch config starts, so the memcheck runs those cubins too: its constant is the config's."""

from __future__ import annotations

from raggedvit.kernels._config import SMALL_T_LIMIT, pick_config
from tests.custom_ops.memcheck_ort_fuzz import LARGE_ATTENTION_T


def test_large_attention_rows_start_at_the_large_config():
    lo, hi = LARGE_ATTENTION_T
    assert lo == SMALL_T_LIMIT and hi > lo
    assert pick_config(lo, 64, "fp16").min_tokens == SMALL_T_LIMIT  # the first T of the large config
    assert pick_config(lo - 1, 64, "fp16").min_tokens == 0
