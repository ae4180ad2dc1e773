"""One request body to one RGB image, or a RequestError with its HTTP status and a one-line message.

    image = decode_request(body, content_type)   # PIL RGB; RequestError(415 | 400 | 413, message)

The body is an image file's bytes (JPEG, PNG, BMP, WebP, TIFF, GIF: raggedvit.images.decode_image, the rule of
`validate --images`), sent as `Content-Type: image/...` or `application/octet-stream`, or with no content type.
Checked before any pixel is decoded: the content type (415), an empty or oversized body (400, 413), the image's
pixel count from its header (413: over PIL's decompression-bomb limit, ~89 megapixels).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from raggedvit.images import ImageTooLarge, decode_image

__all__ = ["MAX_BODY_BYTES", "RequestError", "decode_request"]

MAX_BODY_BYTES = 64 * 2**20  # a larger file is no photo a ViT needs
_SEND = "POST the image file's bytes with Content-Type: image/jpeg (image/png, ...) or application/octet-stream"


@dataclass
class RequestError(Exception):
    """A request the server refuses: `status` (4xx) and a one-line `message` for the client."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


def _media_type(content_type: str | None) -> str:
    """'image/JPEG; charset=x' -> 'image/jpeg'; None -> ''."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_request(body: bytes, content_type: str | None) -> Image.Image:
    """The RGB image of a /predict body; RequestError (415 wrong content type, 400 empty or not an image, 413 over
    MAX_BODY_BYTES or over the pixel limit)."""
    media = _media_type(content_type)
    if media and not (media.startswith("image/") or media == "application/octet-stream"):
        raise RequestError(415, f"content type {media!r} is not an image: {_SEND}")
    if not body:
        raise RequestError(400, f"empty body: {_SEND}")
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"body of {len(body)} bytes is over the limit of {MAX_BODY_BYTES} bytes")
    try:
        return decode_image(body)
    except ImageTooLarge as e:
        raise RequestError(413, str(e)) from None
    except ValueError as e:
        raise RequestError(400, str(e)) from None
