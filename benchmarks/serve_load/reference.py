"""The request bodies of a load run and the direct ONNX Runtime answers they are checked against.

The reference is written apart from the server's Predictor: the body decoded by raggedvit.images.decode_image, then
`preprocess` of the export's timm model (validate's path), a plain session with the op library registered
(raggedvit.runtime.create_session), top-1 by argmax of the logits and its softmax probability in numpy.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.serve_load.client import Body, Outcome

__all__ = ["Reference", "check", "direct_answers", "request_bodies"]

# content type -> PIL format and save options: the three formats the load sends, in turn
_FORMATS = {"image/jpeg": ("JPEG", {"quality": 90}), "image/png": ("PNG", {}), "image/webp": ("WEBP", {"quality": 90})}
PROBABILITY_ATOL = 1e-4  # the server's batch and the reference's differ: float32 sums in another order


def request_bodies(count: int) -> list[Body]:
    """`count` distinct images (the sample photos and their flips, crops and scales: raggedvit.images.image_variants)
    encoded as JPEG, PNG and WebP in turn."""
    from raggedvit.images import image_variants, sample_images

    bodies = []
    types = list(_FORMATS)
    for i, (name, im) in enumerate(image_variants(sample_images(), count)):
        content_type = types[i % len(types)]
        fmt, kwargs = _FORMATS[content_type]
        buf = io.BytesIO()
        im.save(buf, fmt, **kwargs)
        bodies.append(Body(name, content_type, buf.getvalue()))
    return bodies


@dataclass(frozen=True)
class Reference:
    """The direct run's answer to one body: top-1 class, its probability, the kept token counts."""

    top1: int
    probability: float
    token_counts: list[int]


def direct_answers(onnx_path: str | Path, bodies: Sequence[Body], *, batch: int = 8) -> list[Reference]:
    """Each body's Reference from a direct ORT run on the CPU EP (module docstring), `batch` images per run."""
    from raggedvit.exporter.metadata import read_recipe
    from raggedvit.images import decode_image, meta_model, preprocess
    from raggedvit.runtime import create_session

    recipe = read_recipe(str(onnx_path))
    model = meta_model(str(recipe["model"]), int(recipe["img_size"]))
    session = create_session(onnx_path, "cpu")
    out = []
    for start in range(0, len(bodies), batch):
        images = preprocess([decode_image(b.data) for b in bodies[start : start + batch]], model).numpy()
        logits, counts = session.run(["logits", "token_counts"], {"images": images})
        z = logits.astype(np.float64)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        for row, c in zip(p, counts):
            k = int(np.argmax(row))
            out.append(Reference(k, float(row[k]), [int(x) for x in c]))
    return out


def check(outcomes: Sequence[Outcome], reference: Sequence[Reference]) -> list[str]:
    """One line per answered request (200) that differs from the direct run of its body: its top-1 class, that
    class's probability (beyond PROBABILITY_ATOL) or its token counts."""
    bad = []
    for o in outcomes:
        if o.status != 200 or o.answer is None:
            continue
        ref = reference[o.index % len(reference)]
        top1, prob = o.answer["top5"][0]
        counts = o.answer["token_counts"]
        if top1 != ref.top1 or abs(prob - ref.probability) > PROBABILITY_ATOL or counts != ref.token_counts:
            bad.append(
                f"request {o.index}: served top-1 {top1} (p {prob:.6f}), tokens {counts}; direct "
                f"ORT top-1 {ref.top1} (p {ref.probability:.6f}), tokens {ref.token_counts}"
            )
    return bad
