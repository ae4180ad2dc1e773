"""load_vit: seeded init, q/k sharpening, checkpoint files (.pth/.safetensors), errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from raggedvit.weights import load_vit

TINY = {"model_kwargs": {"depth": 2}}


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_seeded_init_is_deterministic_and_sharpened() -> None:
    a, info = load_vit("deit_tiny_patch16_224", seed=3, **TINY)
    b, _ = load_vit("deit_tiny_patch16_224", seed=3, **TINY)
    plain, _ = load_vit("deit_tiny_patch16_224", seed=3, sharpen_qk=1.0, **TINY)
    assert _same(a, b) and not a.training
    w, w0 = a.blocks[0].attn.qkv.weight, plain.blocks[0].attn.qkv.weight
    torch.testing.assert_close(w[: 2 * 192], 4.0 * w0[: 2 * 192])
    assert torch.equal(w[2 * 192 :], w0[2 * 192 :])  # v rows untouched
    assert info.to_dict() == {
        "model_name": "deit_tiny_patch16_224",
        "source": "seeded",
        "checkpoint": None,
        "checkpoint_sha256": None,
        "seed": 3,
        "sharpen_qk": 4.0,
        "img_size": [224, 224],
        "num_classes": 1000,
        "num_prefix_tokens": 1,
    }
    _, default = load_vit("deit_tiny_patch16_224", **TINY)
    assert default.seed == 0


@pytest.mark.parametrize("fmt", ["pth-raw", "pth-state_dict", "pt-model", "safetensors"])
def test_checkpoint_round_trip(tmp_path: Path, fmt: str) -> None:
    src, _ = load_vit("deit_tiny_patch16_224", seed=1, **TINY)
    state = {k: v.clone().contiguous() for k, v in src.state_dict().items()}
    if fmt == "safetensors":
        path = tmp_path / "w.safetensors"
        save_file(state, str(path))
    else:
        path = tmp_path / ("w.pt" if fmt.startswith("pt-") else "w.pth")
        wrapped = {"pth-raw": state, "pth-state_dict": {"state_dict": state}, "pt-model": {"model": state}}[fmt]
        torch.save(wrapped, path)
    model, info = load_vit("deit_tiny_patch16_224", checkpoint=path, **TINY)
    assert _same(model, src)  # no sharpening of loaded weights
    assert info.source == "checkpoint" and info.checkpoint == path.name and info.sharpen_qk == 1.0
    assert info.checkpoint_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_resized_to_img_size(tmp_path: Path) -> None:
    src, _ = load_vit("deit_tiny_patch16_224", seed=1, **TINY)
    path = tmp_path / "w.pth"
    torch.save(src.state_dict(), path)
    model, info = load_vit("deit_tiny_patch16_224", checkpoint=path, img_size=384, **TINY)
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)
    assert info.img_size == (384, 384)
    assert torch.equal(model.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)


def test_checkpoint_key_mismatch_is_one_clear_error(tmp_path: Path) -> None:
    src, _ = load_vit("deit_tiny_patch16_224", seed=1, **TINY)
    state = src.state_dict()
    state.pop("blocks.1.mlp.fc2.bias")
    state["blocks.1.extra"] = torch.zeros(1)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    expected = r"missing keys \['blocks.1.mlp.fc2.bias'\], unexpected keys \['blocks.1.extra'\]"
    with pytest.raises(ValueError, match=expected):
        load_vit("deit_tiny_patch16_224", checkpoint=path, **TINY)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown timm model 'vit_nonexistent'"):
        load_vit("vit_nonexistent")
    with pytest.raises(ValueError, match="not a ViT raggedvit runs"):
        load_vit("resnet18")
    with pytest.raises(ValueError, match="does not exist"):
        load_vit("deit_tiny_patch16_224", checkpoint=tmp_path / "missing.pth")
    (tmp_path / "w.npz").write_bytes(b"")
    with pytest.raises(ValueError, match="unsupported suffix"):
        load_vit("deit_tiny_patch16_224", checkpoint=tmp_path / "w.npz")
    with pytest.raises(ValueError, match="either checkpoint or pretrained"):
        load_vit("deit_tiny_patch16_224", checkpoint=tmp_path / "w.npz", pretrained=True)
