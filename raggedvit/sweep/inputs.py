"""The images of a sweep: the bundled sample photos, or a folder (ImageNet-style class folders give labels)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from raggedvit.sweep.grid import SweepInputError

__all__ = ["SweepImages", "sweep_images"]


@dataclass(frozen=True)
class SweepImages:
    """N images, decoded and preprocessed a batch at a time (a folder of any size fits in memory).

    names: [N] image names; labels: [N] class indices, or None without class folders; source: "sample photos" or
    the folder; load(i): the RGB PIL image of image i."""

    names: tuple[str, ...]
    labels: tuple[int, ...] | None
    source: str
    load: Callable[[int], Image.Image]

    def __len__(self) -> int:
        return len(self.names)

    def batches(self, model: torch.nn.Module, batch: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, images [b, 3, S, S] float32) of consecutive batches of at most `batch` images, with `model`'s
        timm eval transform (raggedvit.images.preprocess)."""
        from raggedvit.images import preprocess

        for start in range(0, len(self), batch):
            stop = min(start + batch, len(self))
            yield start, preprocess([self.load(i) for i in range(start, stop)], model)

    def describe(self) -> dict[str, Any]:
        """What a resumed sweep must find unchanged: source, count, labelled, and a digest of the names and labels."""
        digest = hashlib.sha256(repr((self.names, self.labels)).encode()).hexdigest()[:16]
        return {"source": self.source, "count": len(self), "labelled": self.labels is not None, "digest": digest}


def sweep_images(model: torch.nn.Module, folder: str | Path | None, labels: str | Path | None) -> SweepImages:
    """The sample photos (folder None) or the images of `folder` (raggedvit.images.scan_image_folder); with class
    folders, the class index of each (raggedvit.images.class_indices, from the `labels` file when given).
    SweepInputError when there are no images, a class folder has no index, or labels come without class folders."""
    from raggedvit.images import class_indices, load_image, read_labels, sample_images, scan_image_folder

    if folder is None:
        if labels is not None:
            raise SweepInputError("--labels needs --images DIR with class folders (DIR/<class>/<image>)")
        pairs = sample_images()
        if not pairs:
            raise SweepInputError(
                "no sample images available (install scikit-image, scikit-learn or matplotlib: raggedvit[images]); "
                "or pass --images DIR"
            )
        photos = [im for _, im in pairs]
        return SweepImages(tuple(n for n, _ in pairs), None, "sample photos", photos.__getitem__)
    try:
        found = scan_image_folder(folder)
        if found.classes is None and labels is not None:
            raise ValueError(f"--labels: {str(folder)!r} has no class folders (DIR/<class>/<image>) to label")
        mapping = read_labels(labels) if labels is not None else None
        indices = None if found.classes is None else tuple(class_indices(found.classes, model, mapping))
    except ValueError as e:
        raise SweepInputError(str(e)) from None
    except OSError as e:  # the labels file (the folder's own problems are ValueErrors)
        raise SweepInputError(f"cannot read labels file {str(labels)!r}: {e.strerror or e}") from None
    files = found.files

    def load(i: int) -> Image.Image:
        try:
            return load_image(files[i])
        except ValueError as e:
            raise SweepInputError(str(e)) from None

    return SweepImages(tuple(found.names), indices, str(Path(folder)), load)
