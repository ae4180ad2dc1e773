"""Sample images, image directories and timm preprocessing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from raggedvit.images import load_image_dir, preprocess, sample_images
from raggedvit.weights import load_vit


def test_sample_images_are_real_rgb_photos() -> None:
    images = sample_images()
    names = [n for n, _ in images]
    assert len(names) == len(set(names))
    assert {"chelsea", "coffee", "rocket", "astronaut"} <= set(names)  # scikit-image is a dev dependency
    for _, im in images:
        assert im.mode == "RGB" and min(im.size) >= 200


def test_load_image_dir(tmp_path: Path) -> None:
    for name, color in [("b", (255, 0, 0)), ("a", (0, 255, 0))]:
        Image.new("RGB", (40, 30), color).save(tmp_path / f"{name}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    loaded = load_image_dir(tmp_path)
    assert [n for n, _ in loaded] == ["a", "b"]
    assert loaded[0][1].getpixel((0, 0)) == (0, 255, 0)
    with pytest.raises(ValueError, match="no images"):
        load_image_dir(_empty(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        load_image_dir(tmp_path / "missing")


def _empty(root: Path) -> Path:
    d = root / "empty"
    d.mkdir()
    return d


@pytest.mark.parametrize(("img_size", "side"), [(None, 224), (384, 384)])
def test_preprocess_uses_the_model_resolution(img_size: int | None, side: int) -> None:
    model, _ = load_vit("deit_tiny_patch16_224", img_size=img_size, model_kwargs={"depth": 1})
    images = sample_images()[:3]
    x = preprocess(images, model)
    assert x.shape == (3, 3, side, side) and x.dtype == torch.float32
    assert torch.equal(x[1], preprocess([images[1][1]], model)[0])
    assert float(x.std()) > 0.1  # normalised photo content, not a constant
    with pytest.raises(ValueError, match="at least one image"):
        preprocess([], model)
