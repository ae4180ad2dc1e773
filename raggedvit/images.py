"""Real sample images for tests and demos, and timm preprocessing."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = [
    "IMAGE_FORMATS",
    "IMAGE_SUFFIXES",
    "IMAGE_VARIANTS",
    "ImageFolder",
    "ImageTooLarge",
    "image_variants",
    "NoSampleImages",
    "class_indices",
    "decode_image",
    "eval_transform",
    "load_image",
    "load_image_dir",
    "read_labels",
    "meta_model",
    "preprocess",
    "sample_images",
    "sample_inputs",
    "scan_image_folder",
    "skipped_entries",
    "tile",
    "to_rgb",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")  # multi-frame: the first frame
IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "WEBP", "TIFF", "GIF")  # PIL's names of the same formats (decode_image)
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")  # PIL's 16-bit grayscale (16-bit PNG and TIFF)
_SKIMAGE_NAMES = ("chelsea", "coffee", "rocket", "astronaut")


class ImageTooLarge(ValueError):
    """An image over PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS), refused before its pixels are decoded."""


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


def _crop(box: tuple[float, float, float, float]):
    """A crop by fractions (left, top, right, bottom) of the image's size."""

    def f(im: Image.Image) -> Image.Image:
        w, h = im.size
        return im.crop((round(box[0] * w), round(box[1] * h), round(box[2] * w), round(box[3] * h)))

    return f


def _rescale(factor: float):
    """Down to `factor` of the size and back up (bilinear): the same view with less detail."""

    def f(im: Image.Image) -> Image.Image:
        w, h = im.size
        small = im.resize((max(1, round(w * factor)), max(1, round(h * factor))), Image.Resampling.BILINEAR)
        return small.resize((w, h), Image.Resampling.BILINEAR)

    return f


def _zoom_out(factor: float):
    """The image at `factor` of its size, centred on a grey canvas of the original size."""

    def f(im: Image.Image) -> Image.Image:
        w, h = im.size
        small = im.resize((max(1, round(w * factor)), max(1, round(h * factor))), Image.Resampling.BILINEAR)
        canvas = Image.new("RGB", (w, h), (124, 116, 104))  # ImageNet's mean colour
        canvas.paste(small, ((w - small.width) // 2, (h - small.height) // 2))
        return canvas

    return f


def _flip(im: Image.Image) -> Image.Image:
    return im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


# name -> transform of one photo; deterministic (no random state): flips, crops and scales of the same photo keep
# or drop other tokens at the pruning cuts, which is what a validation over many images needs
IMAGE_VARIANTS = {
    "": lambda im: im,
    "flip": _flip,
    "crop-centre": _crop((0.15, 0.15, 0.85, 0.85)),
    "crop-top-left": _crop((0.0, 0.0, 0.75, 0.75)),
    "crop-bottom-right": _crop((0.25, 0.25, 1.0, 1.0)),
    "flip-crop-top-right": lambda im: _crop((0.0, 0.0, 0.75, 0.75))(_flip(im)),
    "rescale-0.5": _rescale(0.5),
    "zoom-out-0.7": _zoom_out(0.7),
    "rotate-90": lambda im: im.transpose(Image.Transpose.ROTATE_90),
    "crop-bottom-left-0.8": _crop((0.0, 0.2, 0.8, 1.0)),
}


def image_variants(pairs: list[tuple[str, Image.Image]], count: int) -> list[tuple[str, Image.Image]]:
    """`count` images from the photos `pairs`: each photo as it is, then each one flipped, cropped, rescaled (the
    order of IMAGE_VARIANTS, a photo's variant named "NAME:VARIANT"), deterministic. ValueError when the photos
    and their len(IMAGE_VARIANTS) - 1 variants are fewer than `count`."""
    if count > len(pairs) * len(IMAGE_VARIANTS):
        raise ValueError(f"{len(pairs)} photos give at most {len(pairs) * len(IMAGE_VARIANTS)} variants, {count} asked")
    out = []
    for variant, fn in IMAGE_VARIANTS.items():
        for name, im in pairs:
            if len(out) == count:
                return out
            out.append((f"{name}:{variant}" if variant else name, fn(im)))
    return out


def load_image_dir(path: str | Path) -> list[tuple[str, Image.Image]]:
    """All images directly in `path` (sorted by file name; suffixes IMAGE_SUFFIXES, a multi-frame file's first frame)
    as (stem, RGB PIL image); what it leaves out: skipped_entries."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"image directory {str(root)!r} does not exist")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {str(root)!r}")
    out = []
    for p in files:
        out.append((p.stem, _decode(p)))
    return out


@dataclass(frozen=True)
class ImageFolder:
    """The image files of a folder, sorted: directly in it (`classes` None), or ImageNet-style in class folders
    (DIR/<class>/<image>; `classes`: the class folder of each file)."""

    root: Path
    files: tuple[Path, ...]
    classes: tuple[str, ...] | None

    @property
    def names(self) -> list[str]:
        """Each image's name: its stem, under its class folder ("n01440764/img1") with class folders."""
        if self.classes is None:
            return [p.stem for p in self.files]
        return [f"{c}/{p.stem}" for c, p in zip(self.classes, self.files)]


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def scan_image_folder(path: str | Path) -> ImageFolder:
    """The images of `path`: those directly in it, or those of its class folders (one level; folders without
    images are ignored). ValueError when the folder does not exist, has no images, or has both kinds."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"image directory {str(root)!r} does not exist")
    direct = _images_in(root)
    folders = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    by_class = [(d.name, f) for d in folders for f in _images_in(d)]
    if direct and by_class:
        raise ValueError(
            f"{str(root)!r} holds images and class folders with images; use one layout: all images directly in it, "
            "or all in class folders (DIR/<class>/<image>)"
        )
    if by_class:
        return ImageFolder(root, tuple(f for _, f in by_class), tuple(c for c, _ in by_class))
    if not direct:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {str(root)!r} or in its class folders")
    return ImageFolder(root, tuple(direct), None)


def read_labels(path: str | Path) -> dict[str, int]:
    """A labels file -> {class folder name: class index}: one class per line in class-index order, its first word
    the folder name (the form of ImageNet's LOC_synset_mapping.txt: "n01440764 tench, Tinca tinca"), UTF-8 (a
    byte-order mark is skipped). ValueError on another encoding, an empty line, a name given twice, or no lines."""
    out: dict[str, int] = {}
    try:  # UTF-8, with or without a byte-order mark
        lines = Path(path).read_bytes().decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"labels file {str(path)!r} is not UTF-8 text (byte {e.start}: 0x{e.object[e.start]:02x}); save it as UTF-8"
        ) from None
    while lines and not lines[-1].strip():
        lines.pop()
    for i, line in enumerate(lines):
        words = line.split()
        if not words:
            raise ValueError(f"labels file {str(path)!r}: line {i + 1} is empty (each line is one class, in order)")
        if words[0] in out:
            raise ValueError(f"labels file {str(path)!r}: {words[0]!r} on lines {out[words[0]] + 1} and {i + 1}")
        out[words[0]] = i
    if not out:
        raise ValueError(f"labels file {str(path)!r} names no classes")
    return out


def class_indices(classes: Sequence[str], model: torch.nn.Module, labels: Mapping[str, int] | None = None) -> list[int]:
    """The class index of each class folder name: from `labels` when given; else the name itself when it is an
    integer ("281"), else its index in the model's timm label set (ImageNet synsets such as "n01440764", for
    models whose classes timm knows). ValueError naming the first folder without one or out of the model's range."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    num_classes = int(getattr(model, "num_classes", 0) or 0)
    known: Mapping[str, int] | None = labels
    if known is None:
        subset = infer_imagenet_subset(model)
        known = {} if subset is None else {n: i for i, n in enumerate(ImageNetInfo(subset).label_names())}
    out = []
    for name in classes:
        if name in known:
            index = int(known[name])
        elif labels is None and name.isascii() and name.isdigit():
            index = int(name)
        else:
            where = "in the labels file" if labels is not None else "a class index or a synset of the model's classes"
            raise ValueError(f"class folder {name!r} is not {where}; name folders by class index or pass a labels file")
        if not 0 <= index < num_classes:
            raise ValueError(f"class folder {name!r} is class {index}; the model has {num_classes} classes")
        out.append(index)
    return out


def load_image(path: str | Path) -> Image.Image:
    """The RGB image of `path`; ValueError naming the file if it cannot be decoded (see load_image_dir)."""
    return _decode(Path(path))


def skipped_entries(path: str | Path) -> list[str]:
    """What load_image_dir(path) leaves out, sorted, each as "NAME (why)": files without an image suffix and
    folders (not searched)."""
    out = []
    for p in sorted(Path(path).iterdir()):
        if p.is_dir():
            out.append(f"{p.name}/ (a folder: not searched)")
        elif p.suffix.lower() not in IMAGE_SUFFIXES:
            out.append(f"{p.name} (not an image suffix: {', '.join(IMAGE_SUFFIXES)})")
    return out


def _decode(path: Path) -> Image.Image:
    """RGB image of `path` (`to_rgb`); ValueError naming the file if it cannot be decoded, is truncated, is larger
    than PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS, its warning treated as an error: ImageTooLarge), or
    has pixels of no fixed range."""
    return _open_rgb(path, f"cannot decode image {str(path)!r}", formats=None)


def decode_image(data: bytes) -> Image.Image:
    """RGB image of an image file's bytes (a request body), by the rules of the files of load_image_dir, in the
    formats of IMAGE_FORMATS only (PIL opens others, some through external programs: not for bytes from anyone).
    ValueError saying why it cannot be decoded; ImageTooLarge over Image.MAX_IMAGE_PIXELS, found from the header
    before any pixel is decoded."""
    import io

    return _open_rgb(io.BytesIO(data), "cannot decode image", formats=IMAGE_FORMATS)


def _open_rgb(source, what: str, *, formats: tuple[str, ...] | None) -> Image.Image:
    """The one decoding rule of files and bytes: `to_rgb` of the opened image, every failure a one-line ValueError
    "WHAT: reason"."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source, formats=formats) as im:
                return to_rgb(im)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ImageTooLarge(f"{what}: {' '.join(str(e).split())}") from None
    except Image.UnidentifiedImageError as e:
        if formats is None:
            raise ValueError(f"{what}: {' '.join(str(e).split())}") from None
        names = ", ".join("WebP" if f == "WEBP" else f for f in formats)
        raise ValueError(f"{what}: not an image in a supported format ({names})") from None
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"{what}: {reason}") from None


def to_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB of a decoded image (its current frame: a GIF's first). 16-bit grayscale (PIL modes I;16*, and mode I
    from a PNG, whose depth is at most 16 bits) is scaled to 8 bits, v * 255 / 65535 rounded: PIL's own convert
    clips it at 255 (a 16-bit photo would turn almost white). 32-bit integer or float pixels (modes I, F of a TIFF)
    have no fixed range: ValueError."""
    if im.mode in _SIXTEEN_BIT_MODES or (im.mode == "I" and im.format == "PNG"):
        wide = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        return Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), "L").convert("RGB")
    if im.mode in ("I", "F"):
        kind = "float" if im.mode == "F" else "32-bit integer"
        raise ValueError(f"{kind} pixels (PIL mode {im.mode}) have no fixed range: save it as an 8- or 16-bit image")
    return im.convert("RGB")


def eval_transform(model: torch.nn.Module):
    """timm's eval transform of `model` (which may be a `meta_model`) at its built resolution: an RGB PIL image ->
    [3, S, S] float32 tensor (resize, centre crop, normalise by its pretrained data config)."""
    from timm.data import create_transform, resolve_data_config

    args = {}
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None:  # the built resolution wins over the pretrained config's (img_size overrides)
        args["input_size"] = (3, int(img_size[0]), int(img_size[1]))
    config = resolve_data_config(args, model=model)
    return create_transform(**config, is_training=False)


def preprocess(images: list[Image.Image] | list[tuple[str, Image.Image]], model: torch.nn.Module) -> torch.Tensor:
    """PIL images (or (name, image) pairs) -> [B, 3, S, S] float32 with the model's timm eval transform."""
    if not images:
        raise ValueError("preprocess needs at least one image")
    transform = eval_transform(model)
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
