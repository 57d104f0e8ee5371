"""Binary, string, variable-length and sparse columns in the store: specs, the writer, the reader's
object arrays, ColumnOps (padding, masks, collate_fn) and the CSR batches."""

from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from hora.errors import DataError
from hora.store import ColumnOps, ColumnSpec, CsrBatch, make_reader, materialize
from hora.store.columns import pad_rows, sparse_rows_to_csr, vector_batch
from hora.store.writer import sparse_struct

pytestmark = pytest.mark.timeout(120)


def test_column_spec_round_trip_and_old_metadata():
    spec = ColumnSpec("float32", kind="sparse", size=1 << 18)
    assert ColumnSpec.from_dict(spec.to_dict()) == spec
    assert ColumnSpec.from_dict({"dtype": "int64", "shape": [3]}) == ColumnSpec("int64", (3,))  # before kinds
    assert "kind" not in ColumnSpec("int64", (3,)).to_dict()  # dense specs are written as before
    assert ColumnSpec("object", kind="binary").batch_dtype == "object"


def test_bytes_strings_and_ragged_arrays_round_trip_through_the_reader(file_store):
    rng = np.random.default_rng(0)
    n = 300
    tok = [rng.integers(0, 100, rng.integers(1, 12)).astype(np.int32) for _ in range(n)]
    pdf = pd.DataFrame({"raw": [f"b{i}".encode() for i in range(n)], "text": [f"t{i}" for i in range(n)],
                        "tok": tok, "y": np.arange(n, dtype=np.int64)})
    info = materialize(pdf, file_store, ["raw", "text", "tok"], ["y"], num_proc=2)
    assert info.columns["raw"].kind == "binary" and info.columns["text"].kind == "string"
    assert info.columns["tok"] == ColumnSpec("int32", (max(len(t) for t in tok),), kind="ragged")
    seen = 0
    for batch in make_reader(file_store, info, batch_size=32, shuffle=True, shuffle_buffer_size=50):
        for raw, text, ids, y in zip(batch["raw"], batch["text"], batch["tok"], batch["y"]):
            assert raw == f"b{y}".encode() and text == f"t{y}"
            np.testing.assert_array_equal(ids, tok[y])
            seen += 1
    assert seen == n


def test_padding_masks_truncation_and_collate_fn():
    rows = np.empty(3, dtype=object)
    for i, r in enumerate([[1, 2, 3, 4, 5], [6], [7, 8]]):
        rows[i] = np.array(r)
    padded, mask, cut = pad_rows(rows, "int64", max_length=3)
    np.testing.assert_array_equal(padded, [[1, 2, 3], [6, 0, 0], [7, 8, 0]])
    assert mask.sum() == 6 and cut == 1
    specs = {"tok": ColumnSpec("int64", (5,), kind="ragged"), "y": ColumnSpec("int64")}
    batch = {"tok": rows, "y": np.arange(3)}
    out = ColumnOps(specs=specs)(batch)
    assert out["tok"].shape == (3, 5) and out["tok_mask"].sum(1).tolist() == [5, 1, 2]
    strict = ColumnOps(specs=specs, max_length={"tok": 3}, truncation=False)
    with pytest.raises(DataError, match=r"column 'tok' has a row of length 5 .*max_length=3"):
        strict(batch)
    with pytest.raises(DataError, match=r"collate_fn failed on a batch of columns \['tok', 'y'\]: KeyError"):
        ColumnOps(specs=specs, collate_fn=lambda b: b["nope"])(batch)
    with pytest.raises(DataError, match="collate_fn must return a dict"):
        ColumnOps(specs=specs, collate_fn=lambda b: 3)(batch)


def _spark_vectors(rows):
    """Arrow's form of Spark ML vectors: struct<type, size, indices, values> (type 0 sparse, 1 dense)."""
    return pa.array(rows, type=pa.struct([("type", pa.int8()), ("size", pa.int32()),
                                          ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float64()))]))


def test_sparse_struct_vector_batch_and_csr():
    col = _spark_vectors([{"type": 0, "size": 6, "indices": [1, 4], "values": [1.0, 2.0]},
                          {"type": 1, "size": None, "indices": None, "values": [0, 0, 3.0, 0, 0, 0]}])
    stored, size = sparse_struct(col, "v")
    assert size == 6 and stored.field("indices").to_pylist() == [[1, 4], [0, 1, 2, 3, 4, 5]]
    batch = vector_batch(col, "v")
    assert isinstance(batch, CsrBatch) and batch.densify
    np.testing.assert_array_equal(batch.toarray(), [[0, 1, 0, 0, 2, 0], [0, 0, 3, 0, 0, 0]])
    np.testing.assert_array_equal(batch[1:2].toarray(), [[0, 0, 3, 0, 0, 0]])
    np.testing.assert_array_equal(batch.take(np.array([True, False])).toarray(), [[0, 1, 0, 0, 2, 0]])
    dense = vector_batch(_spark_vectors([{"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]}]), "v")
    assert isinstance(dense, np.ndarray) and dense.shape == (1, 2)
    with pytest.raises(DataError, match="column 'v' holds ML vectors of different sizes"):
        sparse_struct(_spark_vectors([{"type": 0, "size": 6, "indices": [1], "values": [1.0]},
                                      {"type": 0, "size": 7, "indices": [1], "values": [1.0]}]), "v")
    pairs = np.empty(2, dtype=object)
    pairs[0], pairs[1] = (np.array([0, 2], np.int32), np.array([1.0, 2.0], np.float32)), (np.zeros(0, np.int32),
                                                                                         np.zeros(0, np.float32))
    np.testing.assert_array_equal(sparse_rows_to_csr(pairs, 3).toarray(), [[1, 0, 2], [0, 0, 0]])


def _pngs(n: int, broken: tuple[int, ...] = ()) -> tuple[np.ndarray, list[np.ndarray]]:
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    rows, images = np.empty(n, dtype=object), []
    for i in range(n):
        img = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        rows[i] = b"broken" if i in broken else buf.getvalue()
        images.append(img)
    return rows, images


@pytest.mark.parametrize("pool", [False, True])
def test_images_decode_into_one_batch_array_serially_or_on_the_decoding_threads(monkeypatch, pool):
    """A batch of images decoded into one (rows, H, W, C) array, on one thread or (a batch of at least
    POOL_MIN_BYTES) on the decoding threads: the same arrays, the same skipped rows, the same first error."""
    import threading

    import hora.store.columns as columns
    from hora.store import decode_image

    monkeypatch.setattr(columns, "POOL_MIN_BYTES", 0 if pool else 1 << 40)
    monkeypatch.setattr(columns, "_POOL_THREADS", 3)
    threads = set()

    def decode(data):
        threads.add(threading.current_thread().name)
        return decode_image(data)

    rows, images = _pngs(40, broken=(3, 17, 30))
    specs = {"img": ColumnSpec("object", kind="binary"), "y": ColumnSpec("int64")}
    batch = {"img": rows, "y": np.arange(40)}
    with pytest.raises(DataError, match="decode_fn of column 'img' failed on row 3 of the batch"):
        ColumnOps(specs=specs, decode={"img": decode})(batch)
    ops = ColumnOps(specs=specs, decode={"img": decode}, on_decode_error="skip")
    out = ops(batch)
    kept = [i for i in range(40) if i not in (3, 17, 30)]
    assert out["img"].shape == (37, 12, 10, 3) and out["img"].dtype == np.uint8 and ops.skipped == 3
    np.testing.assert_array_equal(out["img"], np.stack([images[i] for i in kept]))
    np.testing.assert_array_equal(out["y"], kept)
    assert any(t.startswith("hora-decode") for t in threads) == pool
    rows, _ = _pngs(40, broken=(20, 35))  # on threads: failures in two parts, the first row's is raised
    with pytest.raises(DataError, match="failed on row 20 of the batch"):
        ColumnOps(specs=specs, decode={"img": decode})(dict(batch, img=rows))
    rows, _ = _pngs(40)
    rows[33] = base64.b64decode(  # a 1x1 PNG among 12x10 ones
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
    with pytest.raises(DataError, match="different shapes"):
        ColumnOps(specs=specs, decode={"img": decode})(dict(batch, img=rows))


def test_decode_image_short_png_path_gives_pillows_pixels_and_leaves_the_rest_to_pillow():
    """Plain 8-bit PNGs (L, RGB, RGBA) take the short path with Pillow's exact pixels; palette, LA,
    16-bit, JPEG fall back to Image.open; truncated or damaged PNGs raise a DataError."""
    import io

    from PIL import Image

    from hora.store import decode_image
    from hora.store.images import _decode_png

    rng = np.random.default_rng(0)
    smooth = np.add.outer(np.arange(20), np.arange(30)).astype(np.uint8)  # filters other than None

    def encoded(img: Image.Image, fmt: str = "PNG") -> bytes:
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        return buf.getvalue()

    for arr in (smooth, rng.integers(0, 255, (20, 30), dtype=np.uint8),
                np.dstack([smooth, smooth[::-1], rng.integers(0, 255, (20, 30), dtype=np.uint8)]),
                np.dstack([smooth] * 3 + [rng.integers(0, 255, (20, 30), dtype=np.uint8)])):
        data = encoded(Image.fromarray(arr))
        fast = _decode_png(data)
        assert fast is not None and fast.dtype == np.uint8
        np.testing.assert_array_equal(fast, arr if arr.ndim == 3 else arr[:, :, None])
        np.testing.assert_array_equal(decode_image(data), fast)
    for img in (Image.fromarray(smooth).convert("P"), Image.fromarray(smooth).convert("LA"),
                Image.fromarray(smooth.astype(np.uint16) * 200)):
        data = encoded(img)
        assert _decode_png(data) is None  # Pillow's full path
        want = np.asarray(img.convert("RGB") if img.mode not in ("L", "RGB", "RGBA") else img)
        np.testing.assert_array_equal(decode_image(data), want if want.ndim == 3 else want[:, :, None])
    jpeg = encoded(Image.fromarray(smooth), "JPEG")
    assert _decode_png(jpeg) is None and decode_image(jpeg).shape == (20, 30, 1)
    data = encoded(Image.fromarray(rng.integers(0, 255, (20, 30), dtype=np.uint8)))
    no_end = data[:-12]  # no IEND chunk: Pillow's full path still reads the pixels
    assert _decode_png(no_end) is None and decode_image(no_end).shape == (20, 30, 1)
    for broken in (data[:60], data[:40] + bytes(len(data) - 40)):
        assert _decode_png(broken) is None
        with pytest.raises(DataError, match="not a readable image"):
            decode_image(broken)
