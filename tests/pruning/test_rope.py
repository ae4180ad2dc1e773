"""raggedvit.pruning.rope: packed rows rotate by their original token's rope row, as timm rotates the full
sequence; prefix and evit fused rows stay unrotated."""

from __future__ import annotations

import pytest
import torch
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed, apply_rot_embed_cat

from raggedvit.pruning.rope import apply_packed_rope, extend_rope_table, rope_rows

GRID = (3, 4)
H, D, P = 2, 8, 2  # heads, head dim, prefix tokens


def _tables() -> dict[str, tuple[torch.Tensor, bool]]:
    """name -> (timm's rope table for GRID: [Np, 2D] or [H, Np, 2D], rotate_half)."""
    torch.manual_seed(0)
    cat = RotaryEmbeddingCat(D, in_pixels=False, feat_shape=list(GRID)).get_embed()
    dino = RotaryEmbeddingDinoV3(D, feat_shape=list(GRID)).get_embed()
    mixed = RotaryEmbeddingMixed(D * H, depth=2, num_heads=H, feat_shape=list(GRID)).get_embed()[1]
    return {"cat": (cat, False), "dinov3": (dino, True), "mixed": (mixed, False)}


def _timm_rotate(x: torch.Tensor, table: torch.Tensor, half: bool) -> torch.Tensor:
    """timm's attention: x [B, H, N, D] with p prefix rows first; the patch rows rotate by table's rows."""
    return torch.cat((x[:, :, :P], apply_rot_embed_cat(x[:, :, P:], table, half=half)), dim=2)


@pytest.mark.parametrize("kind", ["cat", "dinov3", "mixed"])
def test_unpruned_rows_equal_timm(kind: str) -> None:
    table, half = _tables()[kind]
    n = GRID[0] * GRID[1] + P
    assert table.shape[-2:] == (GRID[0] * GRID[1], 2 * D)
    x = torch.randn(2, H, n, D)
    ref = _timm_rotate(x, table, half)  # [B, H, N, D]
    packed = x.permute(0, 2, 1, 3).reshape(2 * n, H, D)  # two images, rows in token order
    token_index = torch.arange(n).repeat(2)
    got = apply_packed_rope(packed, rope_rows(extend_rope_table(table), token_index, P), half=half)
    torch.testing.assert_close(got, ref.permute(0, 2, 1, 3).reshape(2 * n, H, D), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["cat", "dinov3", "mixed"])
def test_pruned_rows_keep_their_original_positions(kind: str) -> None:
    """Kept rows in any packed order, plus an evit fused row (-1): each equals the row timm rotates at its
    original index; the fused and prefix rows are returned unchanged."""
    table, half = _tables()[kind]
    n = GRID[0] * GRID[1] + P
    x = torch.randn(1, H, n, D)
    ref = _timm_rotate(x, table, half)[0].transpose(0, 1)  # [N, H, D]
    kept = torch.tensor([0, 1, 13, 2, 7, 5])
    fused = torch.randn(1, H, D)
    packed = torch.cat((x[0].transpose(0, 1)[kept], fused))
    token_index = torch.cat((kept, torch.tensor([-1])))
    got = apply_packed_rope(packed, rope_rows(extend_rope_table(table), token_index, P), half=half)
    torch.testing.assert_close(got[:-1], ref[kept], rtol=0, atol=0)
    torch.testing.assert_close(got[-1], fused[0], rtol=0, atol=0)
    torch.testing.assert_close(got[:2], packed[:2], rtol=0, atol=0)  # prefix rows untouched


def test_rope_rows_shapes_and_half_precision() -> None:
    table, _ = _tables()["mixed"]
    ext = extend_rope_table(table)
    assert ext.shape == (H, GRID[0] * GRID[1] + 1, 2 * D)
    torch.testing.assert_close(ext[:, 0], torch.cat((torch.zeros(H, D), torch.ones(H, D)), dim=1))
    rows = rope_rows(ext, torch.tensor([0, 3, -1]), P)
    assert rows.shape == (3, H, 2 * D)
    cat_rows = rope_rows(extend_rope_table(_tables()["cat"][0]), torch.tensor([0, 3, -1]), P)
    assert cat_rows.shape == (3, 1, 2 * D)
    x16 = torch.randn(3, H, D).half()
    out = apply_packed_rope(x16, rows, half=False)  # float32 angles, result cast back as timm's
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, apply_rot_embed_cat(x16, rows, half=False))
