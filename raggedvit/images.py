"""Real sample images for tests and demos, and timm preprocessing."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch
from PIL import Image

__all__ = [
    "IMAGE_SUFFIXES",
    "NoSampleImages",
    "load_image_dir",
    "meta_model",
    "preprocess",
    "sample_images",
    "sample_inputs",
    "tile",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
_SKIMAGE_NAMES = ("chelsea", "coffee", "rocket", "astronaut")


class NoSampleImages(ValueError):
    """None of the packages that bundle the sample photos is installed."""


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def sample_images() -> list[tuple[str, Image.Image]]:
    """Bundled photos from scikit-image (chelsea, coffee, rocket, astronaut), scikit-learn (china, flower) and
    matplotlib (grace_hopper), as RGB PIL images; packages that are not installed are skipped."""
    out: list[tuple[str, Image.Image]] = []
    if _have("skimage"):
        from skimage import data

        for name in _SKIMAGE_NAMES:
            loader = getattr(data, name, None)
            if loader is not None:
                out.append((name, Image.fromarray(loader()).convert("RGB")))
    if _have("sklearn"):
        from sklearn.datasets import load_sample_images

        bunch = load_sample_images()
        for fname, arr in zip(bunch.filenames, bunch.images):
            out.append((Path(fname).stem, Image.fromarray(arr).convert("RGB")))
    if _have("matplotlib"):
        from matplotlib import cbook

        try:
            with cbook.get_sample_data("grace_hopper.jpg") as f:
                out.append(("grace_hopper", Image.open(f).convert("RGB")))
        except (OSError, ValueError):
            pass
    return out


def load_image_dir(path: str | Path) -> list[tuple[str, Image.Image]]:
    """All images directly in `path` (sorted by file name) as (stem, RGB PIL image)."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"image directory {str(root)!r} does not exist")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {str(root)!r}")
    out = []
    for p in files:
        out.append((p.stem, _decode(p)))
    return out


def _decode(path: Path) -> Image.Image:
    """RGB image of `path`; ValueError naming the file if it cannot be decoded, is truncated, or is larger
    than PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS, its warning treated as an error)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return im.convert("RGB")
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"cannot decode image {str(path)!r}: {reason}") from None


def preprocess(images: list[Image.Image] | list[tuple[str, Image.Image]], model: torch.nn.Module) -> torch.Tensor:
    """PIL images (or (name, image) pairs) -> [B, 3, S, S] float32 with the model's timm eval transform."""
    from timm.data import create_transform, resolve_data_config

    if not images:
        raise ValueError("preprocess needs at least one image")
    args = {}
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None:  # the built resolution wins over the pretrained config's (img_size overrides)
        args["input_size"] = (3, int(img_size[0]), int(img_size[1]))
    config = resolve_data_config(args, model=model)
    transform = create_transform(**config, is_training=False)
    pils = [im[1] if isinstance(im, tuple) else im for im in images]
    return torch.stack([transform(im.convert("RGB")) for im in pils]).to(torch.float32)


def meta_model(name: str, img_size: int | None = None) -> torch.nn.Module:
    """timm's `name` at `img_size`, built on the meta device (no weights, no memory, no download): all that
    `preprocess` reads of a model is its pretrained data config and patch_embed.img_size."""
    import timm

    kwargs = {} if img_size is None else {"img_size": int(img_size)}
    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, **kwargs)


def tile(images: torch.Tensor, batch: int) -> torch.Tensor:
    """[n, 3, S, S] -> [batch, 3, S, S] by repeating the n images in order."""
    reps = -(-batch // images.shape[0])
    return images.repeat(reps, 1, 1, 1)[:batch].contiguous()


def sample_inputs(model: torch.nn.Module, *, random_n: int | None = None) -> torch.Tensor:
    """[n, 3, S, S] float32 model inputs: the sample photos through `preprocess` (timm's eval transform of `model`,
    which may be a `meta_model`), or, only when asked (random_n), n seeded standard-normal images.

    NoSampleImages when no sample photos are available: noise is never a silent stand-in for photos (token pruning
    keeps other tokens of noise, so the timings would differ)."""
    if random_n is not None:
        size = tuple(int(s) for s in model.patch_embed.img_size)
        return torch.randn(random_n, 3, *size, generator=torch.Generator().manual_seed(0))
    pairs = sample_images()
    if not pairs:
        raise NoSampleImages(
            "no sample images available (install scikit-image, scikit-learn or matplotlib: raggedvit[images])"
        )
    return preprocess(pairs, model)
