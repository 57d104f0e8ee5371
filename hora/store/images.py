"""Images stored as encoded bytes (PNG, JPEG, anything Pillow reads), decoded on the rank.

:func:`decode_image` is the default ``decode_fn`` of a binary column (one image to an ``(H, W, C)``
uint8 array); :func:`decode_png_batch` decodes a whole batch of plain 8-bit PNGs at once, which
:class:`hora.store.ColumnOps` uses for the default decoder (see :mod:`hora.store.columns`).
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any, Sequence

import numpy as np

from hora.errors import ConfigError, DataError

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type -> Pillow mode (and raw mode) of the images :func:`_decode_png` reads itself
_PNG_MODES = {0: "L", 2: "RGB", 6: "RGBA"}
_CHUNK = struct.Struct(">I4s")
_IHDR = struct.Struct(">IIBBBBB")


def _png_parts(data: Any) -> tuple[tuple[int, int, str], bytes] | None:
    """``((width, height, mode), compressed pixel data)`` of a plain PNG (8 bits per sample,
    grayscale, RGB or RGBA, not interlaced, every chunk whole, an IEND); None for anything else."""
    if not isinstance(data, bytes) or not data.startswith(_PNG_SIGNATURE):
        return None
    pos, end, head, idat = 8, len(data), None, []
    try:
        while pos + 8 <= end:
            n, kind = _CHUNK.unpack_from(data, pos)
            if pos + 12 + n > end:
                return None
            if kind == b"IHDR":
                width, height, depth, color, _, _, interlace = _IHDR.unpack_from(data, pos + 8)
                if depth != 8 or interlace or color not in _PNG_MODES or not width or not height:
                    return None
                head = (width, height, _PNG_MODES[color])
            elif kind == b"IDAT":
                idat.append(data[pos + 8:pos + 8 + n])
            elif kind == b"IEND":
                break
            pos += 12 + n
        else:
            return None  # no IEND: truncated
    except struct.error:
        return None
    if head is None or not idat:
        return None
    return head, idat[0] if len(idat) == 1 else b"".join(idat)


def _plausible(width: int, height: int) -> bool:
    """Whether an image of this size is left to the short paths: not beyond Pillow's decompression
    bomb limit (``Image.MAX_IMAGE_PIXELS``), which ``Image.open`` enforces with its own error."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return not limit or width * height <= limit


def _inflate_into(image: Any, box: tuple[int, int, int, int], mode: str, compressed: bytes) -> bool:
    """Pillow's own PNG decoder (zlib and unfiltering, in C, without the GIL) on ``compressed``,
    writing the pixels into ``box`` of ``image`` (a Pillow image of ``mode``); whether it decoded
    the whole box (False: the data ended early or is damaged)."""
    from PIL import Image

    decoder = Image._getdecoder(mode, "zip", mode)
    try:
        decoder.setimage(image.im, box)
        done, error = decoder.decode(compressed)
    except Exception:  # anything unexpected: the caller's fallback decides (and names the problem)
        return False
    finally:
        decoder.cleanup()
    return done < 0 and error >= 0  # (as ImageFile.load reads it)


def _decode_png(data: bytes) -> np.ndarray | None:
    """A plain PNG (8 bits per sample, grayscale, RGB or RGBA, not interlaced) decoded by Pillow's own
    zlib/unfilter decoder without its per-image Python (the chunk walk, plugin probing and
    ``tobytes``, most of the time of a small image); None for anything else (palette, 16 bits,
    interlaced, truncated or damaged data), which :func:`decode_image` leaves to ``Image.open``."""
    from PIL import Image

    parts = _png_parts(data)
    if parts is None:
        return None
    (width, height, mode), compressed = parts
    if not _plausible(width, height):
        return None
    try:
        img = Image.new(mode, (width, height))
    except Exception:  # (e.g. no memory for it): Image.open decides
        return None
    if not _inflate_into(img, (0, 0, width, height), mode, compressed):
        return None
    arr = np.asarray(img)
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_png_batch(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A batch of plain PNGs (see :func:`decode_image`) of one size and mode, decoded into one
    ``(rows, H, W, C)`` uint8 array.

    Each image's pixel data is inflated by zlib (in C, without the GIL); the inflated scanlines of
    the whole batch, one all-zero scanline after each image (so that every image's first row is
    unfiltered against zeros, as in its own PNG), go through Pillow's PNG unfiltering once, as one
    tall image; the images' rows are copied out of it once. Per image that is one zlib call, with no
    Pillow decoder object to make, set up and free (a third less CPU per batch of 64 small images
    than a decoder per image, which :func:`_decode_png_rows` still is for a batch this path refuses).

    Returns:
        ``(array, decoded)``: ``decoded[i]`` False for a row not decoded here (not such a PNG,
        another size or mode than the first such row, damaged data), left as zeros for the
        caller to decode otherwise (:func:`decode_image` names the problem); None when no row
        is such a PNG.
    """
    from PIL import Image

    n = len(values)
    parts = [_png_parts(v) for v in values]
    head = next((p[0] for p in parts if p is not None), None)
    if head is None:
        return None
    width, height, mode = head
    if not _plausible(width, height):
        return None
    channels = len(mode)
    stride = width * channels + 1  # a scanline: its filter byte, then its pixels
    size = height * stride
    blank = bytes(size + stride)  # an image's rows and the zero scanline after it
    decoded = np.zeros(n, dtype=bool)
    inflated = []
    for i, p in enumerate(parts):
        raw = b""
        if p is not None and p[0] == head:
            try:
                raw = zlib.decompress(p[1])
            except zlib.error:  # damaged: left to the caller's decoder, which names the problem
                raw = b""
        if len(raw) >= size:
            inflated.append(raw[:size] if len(raw) > size else raw)
            inflated.append(blank[size:])
            decoded[i] = True
        else:  # not such a PNG, or its data ends early
            inflated.append(blank)
    if not decoded.any():
        return _decode_png_rows(parts, head, n)
    scanlines = np.frombuffer(b"".join(inflated), dtype=np.uint8).reshape(n, height + 1, stride)
    bad = (scanlines[:, :, 0] > 4).any(axis=1)  # a filter type PNG does not have: Pillow would fail the batch
    if bad.any():
        scanlines = scanlines.copy()
        scanlines[bad] = 0
        decoded &= ~bad
    try:
        tall = Image.new(mode, (width, (height + 1) * n))
        decoder = Image._getdecoder(mode, "zip", mode)
        try:
            decoder.setimage(tall.im, (0, 0, width, (height + 1) * n))
            done, error = decoder.decode(zlib.compress(scanlines.tobytes() if bad.any() else scanlines.data, 0))
        finally:
            decoder.cleanup()
    except Exception:  # (e.g. no memory for it): one decoder per image, where each row's problem is its own
        return _decode_png_rows(parts, head, n)
    if not (done < 0 and error >= 0):
        return _decode_png_rows(parts, head, n)
    out = np.asarray(tall).reshape(n, height + 1, width, channels)[:, :height].copy()  # writable: torch shares it
    if not decoded.all():
        out[~decoded] = 0
    return out, decoded


def _decode_png_rows(parts: list[Any], head: tuple[int, int, str], n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`decode_png_batch` with one Pillow decoder per image: every image into its band of one
    tall Pillow image (Pillow's decoder per image, no other per-image Python), copied out once."""
    from PIL import Image

    width, height, mode = head
    try:
        tall = Image.new(mode, (width, height * n))
    except Exception:  # (e.g. no memory for it): the rows one by one, where Image.open decides
        return None
    decoded = np.zeros(n, dtype=bool)
    getdecoder, im = Image._getdecoder, tall.im
    for i, p in enumerate(parts):  # (_inflate_into, inlined: this loop is the batch's whole Python)
        if p is None or p[0] != head:
            continue
        decoder = getdecoder(mode, "zip", mode)
        try:
            decoder.setimage(im, (0, height * i, width, height * (i + 1)))
            done, error = decoder.decode(p[1])
            decoded[i] = done < 0 and error >= 0
        except Exception:  # left to the caller's decoder, which names the problem
            pass
        finally:
            decoder.cleanup()
    out = np.asarray(tall).reshape(n, height, width, len(mode)).copy()  # (writable: torch shares it)
    if not decoded.all():
        out[~decoded] = 0
    return out, decoded


def decode_image(data: bytes) -> np.ndarray:
    """Decode one encoded image (PNG, JPEG, anything Pillow reads) to an ``(H, W, C)`` uint8 array.

    Grayscale images come as ``(H, W, 1)``; palette and other modes are converted to RGB
    (RGBA stays RGBA). Plain 8-bit PNGs take a shorter path through Pillow's decoder (the
    same pixels, about half the time of a small image).

    Raises:
        DataError: the bytes are not an image Pillow can read.
    """
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow is a dependency of the image path
        raise ConfigError('decoding images needs Pillow: pip install "hora[images]" (or pass decode_fn)') from exc
    arr = _decode_png(data)
    if arr is not None:
        return arr
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.mode not in ("L", "RGB", "RGBA"):
                img = img.convert("RGB")
            arr = np.asarray(img, dtype=np.uint8)
    except Exception as exc:
        raise DataError(f"not a readable image ({len(data) if data is not None else 0} bytes): "
                        f"{type(exc).__name__}: {exc}") from exc
    return arr[:, :, None] if arr.ndim == 2 else arr


__all__ = ["decode_image", "decode_png_batch"]
