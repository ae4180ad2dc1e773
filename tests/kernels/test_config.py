"""Launch configs shared with the AOT build: coverage, selection rule, constraints."""

from __future__ import annotations

import pytest
import torch

from raggedvit.kernels._config import SMALL_T_LIMIT, aot_configs, block_d, pick_config


def test_aot_configs_cover_every_dtype_and_block_d():
    configs = aot_configs()
    assert {(c.dtype, c.block_d, c.min_tokens) for c in configs} == {
        (dt, bd, mt) for dt in ("fp16", "bf16", "fp32") for bd in (32, 64, 128) for mt in (0, SMALL_T_LIMIT)
    }
    for c in configs:
        assert c.block_m >= 16 and c.block_n >= 16 and c.block_d >= 16  # tl.dot minimum
        assert c.num_warps in (4, 8) and c.num_stages >= 1


@pytest.mark.parametrize("D", [1, 8, 32, 64, 80, 128, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, "fp16"])
def test_pick_config_rule(D, dtype):
    small, large = pick_config(1, D, dtype), pick_config(10**6, D, dtype)
    assert small.block_d == large.block_d == block_d(D)
    assert pick_config(SMALL_T_LIMIT - 1, D, dtype) is small and pick_config(SMALL_T_LIMIT, D, dtype) is large
    assert small.min_tokens == 0 and large.min_tokens == SMALL_T_LIMIT


def test_pick_config_rejects_unknown():
    with pytest.raises(ValueError, match="no kernel config"):
        pick_config(10, 512, torch.float16)
    with pytest.raises(ValueError, match="no kernel config"):
        pick_config(10, 64, torch.float64)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_cls_kernel_columns_per_program(dtype):
    """The cls kernel takes 4 heads x 16 columns a program from SMALL_T_LIMIT rows in fp16 / bf16 (measured on the
    H200), 1024 // BLOCK_D heads x 4 columns below it and in fp32."""
    for D in (32, 64, 128):
        small, large = pick_config(1, D, dtype), pick_config(SMALL_T_LIMIT, D, dtype)
        assert (small.cls_block_n, small.cls_num_warps) == (4, 4)
        assert (large.cls_block_n, large.cls_num_warps) == ((4, 4) if dtype == "fp32" else (16, 4))
        assert small.cls_heads == 1024 // small.block_d
        assert large.cls_heads == (1024 // large.block_d if dtype == "fp32" else 4)
