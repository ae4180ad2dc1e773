"""CPU tests of benchmarks.pdl_chain's pure parts: the tile rules and the forward estimates."""

from __future__ import annotations

from benchmarks.pdl_chain import BLOCKS, estimates, tiles


def test_tiles_rules() -> None:
    assert tiles(197, 2304, "64x64", 132) == (64, 64)
    # narrow32: D-wide outputs at B = 1 / 4 row counts take 32 x 32 tiles, wide ones 64 x 64
    assert tiles(197, 768, "narrow32", 132) == (32, 32)
    assert tiles(197, 3072, "narrow32", 132) == (64, 64)
    assert tiles(788, 768, "narrow32", 132) == (64, 64)
    # fill: the largest tile whose grid reaches the SM count
    assert tiles(197, 3072, "fill", 132) == (64, 64)  # 4 x 48 = 192 programs
    assert tiles(197, 768, "fill", 132) == (32, 32)  # 64 x 64: 48, 32 x 64: 84, 64 x 32: 96, 32 x 32: 168
    assert tiles(99, 384, "fill", 132) == (16, 32)  # nothing reaches 132: the smallest


def test_estimates_use_best_checked_variant() -> None:
    def rec(M: int, variant: str, us: float, err: float = 1e-4) -> dict:
        return {"model": "deit_base", "M": M, "variant": variant, "us_per_chain": us, "rel_err_first_block": err,
                "rule": "64x64", "block_k": 64}  # fmt: skip

    records = [rec(197, "cublas", 120.0), rec(99, "cublas", 60.0), rec(197, "triton", 96.0),
               rec(197, "triton_pdl", 48.0, err=0.5),  # wrong output: never the best
               rec(99, "triton_pdl", 36.0)]  # fmt: skip
    (line,) = estimates(records)
    cublas = (4 * 120.0 + 8 * 60.0) / BLOCKS
    triton = (4 * 96.0 + 8 * 36.0) / BLOCKS
    assert line.startswith("deit_base B=1:")
    assert f"{cublas:.1f} us (cuBLAS)" in line and f"{triton:.1f} us" in line
