"""Sample images, image directories and timm preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raggedvit.images import (
    IMAGE_VARIANTS,
    class_indices,
    image_variants,
    load_image_dir,
    preprocess,
    read_labels,
    sample_images,
    scan_image_folder,
    skipped_entries,
)
from raggedvit.weights import load_vit


def test_sample_images_are_real_rgb_photos() -> None:
    images = sample_images()
    names = [n for n, _ in images]
    assert len(names) == len(set(names))
    assert {"chelsea", "coffee", "rocket", "astronaut"} <= set(names)  # scikit-image is a dev dependency
    for _, im in images:
        assert im.mode == "RGB" and min(im.size) >= 200


def test_image_variants_are_deterministic_and_distinct() -> None:
    photos = [
        ("a", Image.fromarray(np.arange(60 * 80 * 3, dtype=np.uint8).reshape(60, 80, 3) % 251)),
        ("b", Image.new("RGB", (50, 40), (9, 99, 199))),
    ]
    out = image_variants(photos, 2 * len(IMAGE_VARIANTS))
    names = [n for n, _ in out]
    assert names[:4] == ["a", "b", "a:flip", "b:flip"] and len(set(names)) == len(names)
    again = image_variants(photos, len(out))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for (_, x), (_, y) in zip(out, again))
    pixels = {np.asarray(im).tobytes() for n, im in out if n.startswith("a")}
    assert len(pixels) == len(IMAGE_VARIANTS)  # every variant of a photo differs from the others
    assert [n for n, _ in image_variants(photos, 3)] == names[:3]
    with pytest.raises(ValueError, match="2 photos give at most 20 variants, 21 asked"):
        image_variants(photos, 21)


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


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    """A 16-bit grayscale PNG (PIL mode I;16) of a dark-to-light ramp: its 8-bit RGB is the ramp scaled by 255/65535
    (PIL's convert alone clips everything above 255 to white: 99.6% of this image)."""
    ramp = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    with Image.open(tmp_path / "deep.png") as im:
        assert im.mode == "I;16"
    ((name, rgb),) = load_image_dir(tmp_path)
    got = np.asarray(rgb)
    assert name == "deep" and got.shape == (64, 64, 3) and (got[..., 0] == got[..., 2]).all()
    np.testing.assert_allclose(got[..., 0], ramp / 257.0, atol=0.5)
    assert (got == 255).mean() < 0.01


def test_a_folder_of_jpegs_and_gifs_reads_both(tmp_path: Path) -> None:
    """GIFs are read (their first frame); what is left out is listed with the reason."""
    Image.new("RGB", (32, 32), (200, 10, 10)).save(tmp_path / "a.jpg")
    frames = [Image.new("RGB", (32, 32), c) for c in ((0, 0, 255), (0, 255, 0))]
    frames[0].save(tmp_path / "b.gif", save_all=True, append_images=frames[1:])
    (tmp_path / "c.txt").write_text("notes")
    (tmp_path / "sub").mkdir()
    loaded = dict(load_image_dir(tmp_path))
    assert sorted(loaded) == ["a", "b"] and loaded["b"].mode == "RGB"
    assert loaded["b"].getpixel((5, 5)) == (0, 0, 255)  # the first frame
    assert skipped_entries(tmp_path) == [
        "c.txt (not an image suffix: .jpg, .jpeg, .png, .bmp, .webp, .tif, .tiff, .gif)",
        "sub/ (a folder: not searched)",
    ]


def test_pixels_of_no_fixed_range_are_refused(tmp_path: Path) -> None:
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "f.tif")
    with pytest.raises(ValueError, match=r"cannot decode image '.*f.tif': float pixels \(PIL mode F\) have no fixed"):
        load_image_dir(tmp_path)


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


def _save(path: Path, color=(10, 20, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), color).save(path)


def test_scan_image_folder_flat_and_class_folders(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    _save(flat / "b.png")
    _save(flat / "a.jpg")
    found = scan_image_folder(flat)
    assert found.classes is None and found.names == ["a", "b"]
    classes = tmp_path / "classes"
    _save(classes / "n02123045" / "cat.png")
    _save(classes / "7" / "x.png")
    (classes / "empty").mkdir()
    found = scan_image_folder(classes)
    assert found.classes == ("7", "n02123045") and found.names == ["7/x", "n02123045/cat"]
    _save(classes / "loose.png")
    with pytest.raises(ValueError, match="holds images and class folders"):
        scan_image_folder(classes)
    with pytest.raises(ValueError, match="no images"):
        scan_image_folder(_empty(tmp_path))


def test_class_indices_from_names_synsets_and_labels_file(tmp_path: Path) -> None:
    model, _ = load_vit("deit_tiny_patch16_224", model_kwargs={"depth": 1})
    assert class_indices(["7", "n02123045", "n01440764"], model) == [7, 281, 0]  # ImageNet-1k synsets, by timm
    labels = tmp_path / "labels.txt"
    labels.write_text("cats a cat\ndogs\n\n")
    assert read_labels(labels) == {"cats": 0, "dogs": 1}
    assert class_indices(["dogs", "cats"], model, read_labels(labels)) == [1, 0]
    with pytest.raises(ValueError, match="'birds' is not in the labels file"):
        class_indices(["birds"], model, read_labels(labels))
    with pytest.raises(ValueError, match="'birds' is not a class index or a synset"):
        class_indices(["birds"], model)
    with pytest.raises(ValueError, match="class 1000; the model has 1000 classes"):
        class_indices(["1000"], model)
    labels.write_text("cats\n\ndogs\n")
    with pytest.raises(ValueError, match="line 2 is empty"):
        read_labels(labels)
    labels.write_text("cats\ncats\n")
    with pytest.raises(ValueError, match="'cats' on lines 1 and 2"):
        read_labels(labels)


def test_labels_file_encodings(tmp_path):
    """UTF-8 with a byte-order mark reads as without; another encoding is refused naming the file and UTF-8."""
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffcats\ndogs\n".encode())
    assert read_labels(bom) == {"cats": 0, "dogs": 1}
    latin = tmp_path / "latin.txt"
    latin.write_bytes("chats\nlévriers\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"labels file '.*latin.txt' is not UTF-8 text \(byte 7: 0xe9\); save it"):
        read_labels(latin)
