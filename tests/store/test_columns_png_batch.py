"""The default image decoder on a whole batch of plain PNGs (hora.store.images.decode_png_batch): Pillow's
pixels, one writable (rows, H, W, C) array, and every other row left to decode_image as before."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from hora.errors import DataError
from hora.store import ColumnOps, ColumnSpec, decode_image
from hora.store.images import decode_png_batch

pytestmark = pytest.mark.timeout(120)

SPECS = {"img": ColumnSpec("object", kind="binary"), "y": ColumnSpec("int64")}
ONE_PIXEL = base64.b64decode(  # a 1x1 RGB PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")


def _encoded(img, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _images(n: int, channels: int, seed: int = 0) -> list[np.ndarray]:
    """Images whose rows PNG encodes with every filter (smooth ramps and noise), (20, 30, channels)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        smooth = (np.add.outer(np.arange(20), np.arange(30)) * (i % 5 + 1)).astype(np.uint8)
        planes = [smooth if c % 2 == 0 else rng.integers(0, 255, (20, 30), dtype=np.uint8) for c in range(channels)]
        out.append(np.dstack(planes))
    return out


def _rows(images: list[np.ndarray]) -> np.ndarray:
    from PIL import Image

    rows = np.empty(len(images), dtype=object)
    for i, img in enumerate(images):
        rows[i] = _encoded(Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img))
    return rows


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_a_batch_of_plain_pngs_decodes_to_pillows_pixels_in_one_writable_array(channels):
    images = _images(9, channels)
    rows = _rows(images)
    out, decoded = decode_png_batch(rows)
    assert decoded.all() and out.shape == (9, 20, 30, channels) and out.dtype == np.uint8
    assert out.flags.writeable and out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.stack(images))
    np.testing.assert_array_equal(out, np.stack([decode_image(r) for r in rows]))
    ops = ColumnOps(specs=SPECS, decode={"img": decode_image})
    np.testing.assert_array_equal(ops({"img": rows, "y": np.arange(9)})["img"], out)


def test_rows_the_batch_path_cannot_read_are_decoded_one_by_one_as_before():
    """A JPEG and a palette PNG of the same size (Image.open's path), damaged data (an error naming the
    row, or skipped and counted), a first row that is not a PNG: the same arrays as decode_image's."""
    from PIL import Image

    images = _images(8, 3)
    rows = _rows(images)
    rows[0] = _encoded(Image.fromarray(images[0]), "JPEG")  # not a PNG: the first PNG row sets the shape
    rows[4] = _encoded(Image.fromarray(images[4]).convert("P"))
    out, decoded = decode_png_batch(rows)
    assert decoded.tolist() == [False, True, True, True, False, True, True, True]
    assert not out[0].any() and not out[4].any()  # left as zeros for the caller
    ops = ColumnOps(specs=SPECS, decode={"img": decode_image})
    got = ops({"img": rows, "y": np.arange(8)})["img"]
    np.testing.assert_array_equal(got, np.stack([decode_image(r) for r in rows]))
    np.testing.assert_array_equal(got[1:4], np.stack(images[1:4]))

    damaged = rows.copy()
    damaged[6] = rows[6][:50] + bytes(len(rows[6]) - 50)  # a whole PNG's length of bytes, its data zeroed
    damaged[2] = b"broken"
    with pytest.raises(DataError, match="decode_fn of column 'img' failed on row 2 of the batch"):
        ColumnOps(specs=SPECS, decode={"img": decode_image})({"img": damaged, "y": np.arange(8)})
    skip = ColumnOps(specs=SPECS, decode={"img": decode_image}, on_decode_error="skip")
    kept = skip({"img": damaged, "y": np.arange(8)})
    assert skip.skipped == 2 and kept["y"].tolist() == [0, 1, 3, 4, 5, 7]
    np.testing.assert_array_equal(kept["img"], got[[0, 1, 3, 4, 5, 7]])

    other = rows.copy()
    other[5] = ONE_PIXEL  # a plain PNG of another size: one shape per batch, as before
    with pytest.raises(DataError, match="different shapes"):
        ColumnOps(specs=SPECS, decode={"img": decode_image})({"img": other, "y": np.arange(8)})


def test_a_batch_without_a_plain_png_is_left_to_the_row_by_row_path():
    from PIL import Image

    images = _images(3, 3)
    rows = np.empty(3, dtype=object)
    rows[:] = [_encoded(Image.fromarray(img), "JPEG") for img in images]
    assert decode_png_batch(rows) is None
    out = ColumnOps(specs=SPECS, decode={"img": decode_image})({"img": rows, "y": np.arange(3)})["img"]
    np.testing.assert_array_equal(out, np.stack([decode_image(r) for r in rows]))
    assert decode_png_batch(np.empty(0, dtype=object)) is None


def test_a_png_header_past_pillows_size_limit_goes_to_image_open_which_refuses_it(monkeypatch):
    """A header claiming more pixels than Image.MAX_IMAGE_PIXELS: no short path allocates it; the
    row gets Image.open's decompression-bomb refusal as a DataError naming the row."""
    from PIL import Image

    rows = _rows(_images(4, 1))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # the 20x30 images are past it now
    assert decode_png_batch(rows) is None
    with pytest.raises(DataError, match="failed on row 0 of the batch.*not a readable image"):
        ColumnOps(specs=SPECS, decode={"img": decode_image})({"img": rows, "y": np.arange(4)})


def _png_with_filters(pixels: np.ndarray, filters: list[int]) -> bytes:
    """A PNG of ``pixels`` ((H, W) or (H, W, C) uint8) whose row ``r`` is encoded with PNG filter
    ``filters[r]`` (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth), written by hand (Pillow picks its own)."""
    import struct
    import zlib

    img = pixels if pixels.ndim == 3 else pixels[:, :, None]
    h, w, c = img.shape
    cur = img.reshape(h, w * c).astype(np.int32)
    out = bytearray()
    for r in range(h):
        above = cur[r - 1] if r else np.zeros(w * c, np.int32)
        left = np.concatenate([np.zeros(c, np.int32), cur[r, :-c]])
        upleft = np.concatenate([np.zeros(c, np.int32), above[:-c]])
        if filters[r] == 0:
            pred = np.zeros(w * c, np.int32)
        elif filters[r] == 1:
            pred = left
        elif filters[r] == 2:
            pred = above
        elif filters[r] == 3:
            pred = (left + above) // 2
        else:
            p = left + above - upleft
            pa, pb, pc = abs(p - left), abs(p - above), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, above, upleft))
        out.append(filters[r])
        out += ((cur[r] - pred) % 256).astype(np.uint8).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    color = {1: 0, 3: 2, 4: 6}[c]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(out))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("channels", [1, 3])
def test_every_png_filter_on_every_row_decodes_as_pillow_does_the_first_row_against_zeros(channels):
    """The batch path unfilters all images as one tall image with a zero scanline after each: an image's
    first row under Up, Average or Paeth must still see zeros above it, not the previous image's last row."""
    from PIL import Image

    rng = np.random.default_rng(1)
    rows = np.empty(10, dtype=object)
    pixels = []
    for i in range(10):
        img = rng.integers(0, 256, (6, 7, channels), dtype=np.uint8)
        pixels.append(img)
        first = i % 5  # every filter on the first row, across the batch
        rows[i] = _png_with_filters(img, [first] + [(first + r) % 5 for r in range(1, 6)])
        with Image.open(io.BytesIO(rows[i])) as im:  # the hand-made PNG is what Pillow reads
            np.testing.assert_array_equal(np.asarray(im).reshape(img.shape), img)
    out, decoded = decode_png_batch(rows)
    assert decoded.all()
    np.testing.assert_array_equal(out, np.stack(pixels))


def test_a_row_with_an_unknown_filter_type_or_cut_pixel_data_is_left_alone_and_the_others_decode(monkeypatch):
    """A scanline filter byte PNG does not define (5) would make Pillow fail the whole tall image; cut
    pixel data makes zlib fail: those rows come back not decoded (zeros), every other row decoded, on the
    batch path itself (not its fallback of one Pillow decoder per image)."""
    from hora.store import images as images_module

    def no_fallback(*args):
        raise AssertionError("the batch path fell back to a decoder per image")
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (5, 4), dtype=np.uint8) for _ in range(6)]
    rows = np.empty(6, dtype=object)
    rows[:] = [_png_with_filters(img, [0, 1, 2, 3, 4]) for img in images]
    rows[1] = _png_with_filters(images[1], [0, 1, 5, 3, 4])  # filter type 5 on its third row
    good = _png_with_filters(images[4], [0, 1, 2, 3, 4])
    idat = good.index(b"IDAT")
    import struct
    import zlib

    n = struct.unpack(">I", good[idat - 4:idat])[0]
    data = good[idat + 4:idat + 4 + n][: n // 2]  # half the compressed stream, in a well-formed chunk
    crc = struct.pack(">I", zlib.crc32(b"IDAT" + data) & 0xFFFFFFFF)
    rows[4] = good[:idat - 4] + struct.pack(">I", len(data)) + b"IDAT" + data + crc + good[idat + 4 + n + 4:]
    with monkeypatch.context() as patch:
        patch.setattr(images_module, "_decode_png_rows", no_fallback)
        out, decoded = decode_png_batch(rows)
    assert decoded.tolist() == [True, False, True, True, False, True]
    assert not out[1].any() and not out[4].any()
    np.testing.assert_array_equal(out[[0, 2, 3, 5]], np.stack([images[i] for i in (0, 2, 3, 5)])[..., None])
    with pytest.raises(DataError, match="row 1 of the batch"):
        ColumnOps(specs=SPECS, decode={"img": decode_image})({"img": rows, "y": np.arange(6)})
