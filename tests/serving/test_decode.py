"""raggedvit.serving.decode: every format of `validate --images` decodes from a request body; a body that is no image
gets its 4xx and a one-line message, decided before any pixel is decoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from raggedvit.serving import decode
from raggedvit.serving.decode import RequestError, decode_request


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    from raggedvit.images import sample_images

    return dict(sample_images())["chelsea"]


def _bytes(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize(
    "fmt,content_type",
    [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("BMP", "image/bmp"), ("WEBP", "image/webp"),
     ("TIFF", "image/tiff"), ("GIF", "image/gif")],
)  # fmt: skip
def test_every_format_decodes(photo, fmt, content_type):
    source = photo.convert("P") if fmt == "GIF" else photo
    image = decode_request(_bytes(source, fmt), content_type)
    assert image.mode == "RGB" and image.size == photo.size
    if fmt in ("PNG", "BMP", "TIFF"):  # lossless: the very pixels
        assert np.array_equal(np.asarray(image), np.asarray(photo))


def test_sixteen_bit_png_is_scaled_not_clipped(photo):
    gray = np.asarray(photo.convert("L"), np.uint16)
    image = decode_request(_bytes(Image.fromarray(gray * 257), "PNG"), "image/png")
    assert np.array_equal(np.asarray(image)[..., 0], gray.astype(np.uint8))


@pytest.mark.parametrize(
    "content_type", [None, "", "application/octet-stream", "image/jpeg; charset=binary", "IMAGE/JPEG", "image/png"]
)
def test_image_or_octet_stream_or_no_content_type_is_taken(photo, content_type):
    """The bytes decide the format: a JPEG sent as image/png decodes as the JPEG it is."""
    assert decode_request(_bytes(photo, "JPEG"), content_type).size == photo.size


def _big_png() -> bytes:
    """A 10,000 x 10,000 (100 megapixel) 1-bit PNG: 12 KB of file, refused from its header."""
    return _bytes(Image.new("1", (10_000, 10_000)), "PNG")


@pytest.mark.parametrize(
    "case,content_type,status,fragment",
    [
        ("empty", "image/jpeg", 400, "empty body"),
        ("jpeg", "text/plain", 415, "content type 'text/plain' is not an image"),
        ("jpeg", "application/x-www-form-urlencoded", 415, "Content-Type: image/jpeg"),
        ("jpeg", "multipart/form-data; boundary=x", 415, "is not an image"),
        ("text", "image/jpeg", 400, "not an image in a supported format (JPEG, PNG, BMP, WebP, TIFF, GIF)"),
        ("eps", "image/x-eps", 400, "not an image in a supported format"),
        ("truncated", "image/jpeg", 400, "cannot decode image: image file is truncated"),
        ("100 megapixels", "image/png", 413, "exceeds limit of 89478485 pixels"),
    ],
)
def test_bad_bodies_get_their_4xx(photo, case, content_type, status, fragment):
    jpeg = _bytes(photo, "JPEG")
    body = {
        "empty": b"",
        "jpeg": jpeg,
        "text": b"hello, not an image",
        "eps": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n",  # PIL would run Ghostscript on it
        "truncated": jpeg[: len(jpeg) // 2],
        "100 megapixels": _big_png(),
    }[case]
    with pytest.raises(RequestError) as err:
        decode_request(body, content_type)
    assert err.value.status == status
    assert fragment in err.value.message and "\n" not in err.value.message, err.value.message


def test_oversized_body_is_413(photo, monkeypatch):
    monkeypatch.setattr(decode, "MAX_BODY_BYTES", 1000)
    with pytest.raises(RequestError) as err:
        decode_request(_bytes(photo, "JPEG"), "image/jpeg")
    assert err.value.status == 413 and "over the limit of 1000 bytes" in err.value.message
