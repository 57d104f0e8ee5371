"""Batches of the columns a model cannot take as they are stored: decoding, padding, sparse rows.

The reader gives binary, string, variable-length ("ragged") and sparse columns as 1-d
object arrays (:attr:`hora.store.ColumnSpec.kind`). A :class:`ColumnOps` turns such a
batch into arrays a model takes, in the reader's prefetch thread (``make_reader(batch_fn=)``),
so the training step never waits for it:

* binary columns: decoded row by row by a ``decode_fn`` per column (default
  :func:`~hora.store.images.decode_image`: PNG/JPEG/... bytes -> an ``(H, W, C)`` uint8 array through Pillow),
  straight into one ``(rows, *shape)`` array (plain PNGs, the default decoder's, a batch at
  once: :func:`decode_png_batch`). A row that fails to decode raises
  :class:`~hora.errors.DataError` naming the column and the row's place in the stored
  file of its input partition, or (``on_decode_error="skip"``) is dropped, counted and logged.
* ragged columns: padded with zeros to the batch's longest row (at most ``max_length``;
  longer rows truncated, counted and logged, or a DataError with ``truncation=False``),
  with a ``<col>_mask`` bool array (True on real values) beside it.
* sparse columns: a :class:`CsrBatch` (``indptr``, ``indices``, ``values``, ``shape``:
  torch's ``sparse_csr_tensor`` arguments) or, with ``sparse_format="dense"``, a dense
  ``(rows, size)`` array made per batch.
* string columns are left as object arrays of ``str`` (for a tokenizer in
  ``transformation_fn`` or ``collate_fn``).

With a ``collate_fn``, only the decoding is done here: ``collate_fn(batch)`` gets the
decoded images and the rest as object arrays and returns the batch the model gets.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.store.dataset import ColumnSpec
from hora.store.images import decode_image, decode_png_batch

logger = logging.getLogger(__name__)

DECODE_ERROR_MODES = ("raise", "skip")
SPARSE_FORMATS = ("csr", "dense")
#: The batch column of the reader that says where each row is stored (hora.store.reader.ROW_ID).
_ROW_ID = "__hora_row__"
MASK_SUFFIX = "_mask"
#: a batch's encoded bytes (of one column) from which its rows are decoded on :data:`_POOL_THREADS`
#: threads (Pillow releases the GIL while it decodes; for small images the per-row Python around it
#: dominates, and one thread is faster)
POOL_MIN_BYTES = 1 << 20
_POOL_THREADS = max(1, min(4, os.cpu_count() or 1))
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's image-decoding threads (started on first use, shared by every reader)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="hora-decode")
        return _POOL


@dataclass(frozen=True)
class CsrBatch:
    """One batch of a sparse column in compressed-row form (``torch.sparse_csr_tensor``'s arguments).

    Attributes:
        indptr: int64 ``(rows + 1,)``: row ``i``'s entries are ``indices[indptr[i]:indptr[i+1]]``.
        indices: int64 column indices. values: the values. shape: ``(rows, size)``.
        densify: the model takes it dense (made per forward chunk, see :func:`vector_batch`).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]
    densify: bool = False

    def __len__(self) -> int:  # rows, as a batch column's len()
        return self.shape[0]

    def __getitem__(self, rows: Any) -> "CsrBatch":
        """Rows by a slice (``batch[a:b]``, as inference cuts chunks), a boolean mask or indices."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            if step == 1:
                lo, hi = int(self.indptr[start]), int(self.indptr[max(start, stop)])
                return CsrBatch(self.indptr[start:max(start, stop) + 1] - lo, self.indices[lo:hi],
                                self.values[lo:hi], (max(0, stop - start), self.shape[1]), self.densify)
            rows = np.arange(start, stop, step)
        return self.take(rows)

    def toarray(self) -> np.ndarray:
        """The dense ``(rows, size)`` array."""
        out = np.zeros(self.shape, dtype=self.values.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = self.values
        return out

    def take(self, rows: Any) -> "CsrBatch":
        """The given rows (a boolean mask or indices), in order."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        starts, stops = self.indptr[rows], self.indptr[rows + 1]
        lengths = stops - starts
        pick = (np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)]).astype(np.int64)
                if len(rows) else np.zeros(0, np.int64))
        return CsrBatch(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), self.indices[pick],
                        self.values[pick], (len(rows), self.shape[1]), self.densify)


#: Spark ML vectors up to this dimension reach a model dense at transform (larger ones as CSR)
DENSE_VECTOR_LIMIT = 1 << 16


def vector_batch(column: Any, name: str, dtype: str = "float32") -> np.ndarray | CsrBatch:
    """A Spark ML vector column as Arrow hands it to Python (``struct<type, size, indices, values>``),
    for inference: dense vectors as an ``(rows, size)`` array; sparse ones as a :class:`CsrBatch`
    (no per-row Python), to be densified per forward chunk up to :data:`DENSE_VECTOR_LIMIT`
    dimensions, else given to the model as ``torch.sparse_csr`` (what ``compress_sparse_cols`` trains on).

    Raises:
        DataError: nulls, or vectors of different sizes (names the column).
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise DataError(f"feature column {name!r} has {column.null_count} null values")
    if column.offset:
        column = pa.concat_arrays([column])
    n = len(column)
    typ = column.field("type").to_numpy(zero_copy_only=False)
    if n and (typ == 1).all():  # dense vectors
        values = column.field("values")
        flat = np.asarray(values.values.to_numpy(zero_copy_only=False), dtype=dtype)
        if len(flat) % n:
            raise DataError(f"feature column {name!r} holds ML vectors of different sizes")
        return flat.reshape(n, len(flat) // n)
    if (typ == 1).any():
        from hora.store.writer import sparse_struct

        column, size = sparse_struct(column, name, dtype)
    else:
        sizes = column.field("size").to_numpy(zero_copy_only=False)
        size = int(sizes.max()) if n else 0
        if n and int(sizes.min()) != size:
            raise DataError(f"feature column {name!r} holds ML vectors of different sizes")
    idx, val = column.field("indices"), column.field("values")
    offsets = idx.offsets.to_numpy().astype(np.int64)
    indptr = offsets - offsets[0]
    lo, hi = int(offsets[0]), int(offsets[-1]) if n else 0
    indices = idx.values.to_numpy(zero_copy_only=False)[lo:hi].astype(np.int64)
    values = np.asarray(val.values.to_numpy(zero_copy_only=False)[lo:hi], dtype=dtype)
    return CsrBatch(indptr, indices, values, (n, size), densify=size <= DENSE_VECTOR_LIMIT)


def arrow_objects(column: Any, name: str) -> tuple[np.ndarray, ColumnSpec] | None:
    """An Arrow column of bytes, strings or variable-length 1-d lists of numbers as the reader gives
    such a column (a 1-d object array) with its spec; None for any other column (numbers, fixed-size
    arrays: the caller converts those).

    Raises:
        DataError: null values in such a column (names it).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    kind = ("binary" if pa.types.is_binary(t) or pa.types.is_large_binary(t) else
            "string" if pa.types.is_string(t) or pa.types.is_large_string(t) else None)
    if kind is None and (pa.types.is_list(t) or pa.types.is_large_list(t)) and not pa.types.is_nested(t.value_type):
        lengths = pc.list_value_length(column)
        if len(column) and pc.min(lengths).as_py() != pc.max(lengths).as_py():
            kind = "ragged"
    if kind is None:
        return None
    if column.null_count:
        raise DataError(f"feature column {name!r} has {column.null_count} null values")
    from hora.store.arrow_arrays import object_rows  # the reader's conversion, for the same arrays

    dtype = "object" if kind != "ragged" else np.dtype(t.value_type.to_pandas_dtype()).name
    spec = ColumnSpec(dtype, kind=kind)
    return object_rows(column, spec), spec


def sparse_rows_to_csr(rows: np.ndarray, size: int, dtype: Any = np.float32) -> CsrBatch:
    """An object array of ``(indices, values)`` pairs (a sparse column's batch) -> a :class:`CsrBatch`."""
    n = len(rows)
    lengths = np.fromiter((len(r[0]) for r in rows), dtype=np.int64, count=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    if n and indptr[-1]:
        indices = np.concatenate([r[0] for r in rows]).astype(np.int64, copy=False)
        values = np.concatenate([r[1] for r in rows]).astype(dtype, copy=False)
    else:
        indices, values = np.zeros(0, np.int64), np.zeros(0, dtype)
    return CsrBatch(indptr, indices, values, (n, int(size)))


def pad_rows(rows: np.ndarray, dtype: Any, max_length: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """An object array of 1-d arrays -> ``(padded (rows, L), mask (rows, L) bool, truncated rows)``:
    ``L`` the longest row (at least 1), at most ``max_length``; zeros where the mask is False."""
    n = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=n)
    longest = int(lengths.max()) if n else 0
    width = max(1, longest if max_length is None else min(longest, max_length))
    out = np.zeros((n, width), dtype=dtype)
    mask = np.zeros((n, width), dtype=bool)
    truncated = int((lengths > width).sum())
    for i, r in enumerate(rows):
        k = min(len(r), width)
        out[i, :k] = r[:k]
        mask[i, :k] = True
    return out, mask, truncated


def _pooled(values: Sequence[Any]) -> bool:
    """Whether a batch's encoded images are decoded on the decoding threads (:data:`POOL_MIN_BYTES`)."""
    if _POOL_THREADS <= 1:
        return False
    try:
        return sum(len(v) for v in values) >= POOL_MIN_BYTES
    except TypeError:  # not bytes: a user's decode_fn on other values
        return False


@dataclass
class ColumnOps:
    """What the rank does to each batch of non-dense columns (see the module docstring); a
    ``batch_fn`` for :func:`hora.store.make_reader` (call it with a batch, get the batch back).

    Attributes:
        specs: the stored spec of each batch column.
        decode: binary column -> its decode function (None: keep the bytes).
        on_decode_error: ``"raise"`` or ``"skip"``.
        max_length: per ragged column, the most values a row keeps (None: the batch's longest).
        truncation: cut rows longer than ``max_length`` (else a DataError naming the column and length).
        sparse_format: ``"csr"`` (a :class:`CsrBatch`) or ``"dense"``.
        masks: mask keys to add (``<col>_mask``) -> their column (ragged: which values are real;
            a fixed-length array column: all True).
        collate_fn: the user's function on the (decoded) numpy batch, instead of padding and sparse batching.
        where: ``row id -> "row i of file"`` for messages (the reader's :func:`row_position`).
    """

    specs: dict[str, ColumnSpec]
    decode: dict[str, Callable | None] = field(default_factory=dict)
    on_decode_error: str = "raise"
    max_length: dict[str, int] = field(default_factory=dict)
    truncation: bool = True
    sparse_format: str = "csr"
    masks: dict[str, str] = field(default_factory=dict)
    collate_fn: Callable | None = None
    where: Callable[[int], str] | None = None
    #: counters (rows skipped by on_decode_error="skip", rows truncated to max_length)
    skipped: int = 0
    truncated: int = 0
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.on_decode_error not in DECODE_ERROR_MODES:
            raise ConfigError(f"on_decode_error must be one of {DECODE_ERROR_MODES}, got {self.on_decode_error!r}")
        if self.sparse_format not in SPARSE_FORMATS:
            raise ConfigError(f"sparse_format must be one of {SPARSE_FORMATS}, got {self.sparse_format!r}")

    @property
    def needed(self) -> bool:
        """Whether any batch needs this (else the reader's batches go to the model as they are)."""
        return bool(self.decode or self.masks or self.collate_fn is not None or any(
            s.kind in ("ragged", "sparse") for s in self.specs.values()))

    def _where(self, batch: Mapping[str, Any], i: int) -> str:
        ids = batch.get(_ROW_ID)
        if ids is not None and self.where is not None:
            return self.where(int(ids[i]))
        return f"row {i} of the batch"

    def _decode(self, batch: dict[str, Any], keep: np.ndarray) -> None:
        """Each binary column with a decoder: its rows decoded straight into one ``(rows, *shape)``
        array (rows that failed under ``on_decode_error="skip"`` left as zeros, ``keep[i]`` False)."""
        for col, fn in self.decode.items():
            if fn is None or col not in batch:
                continue
            values = batch[col]
            n = len(values)
            if fn is decode_image and n and not _pooled(values):  # plain PNGs: the batch at once
                got = decode_png_batch(values)
                if got is not None:
                    out, decoded = got
                    self._decode_into(batch, col, fn, np.flatnonzero(~decoded), keep, out)  # the others, one by one
                    batch[col] = out
                    continue
            first = 0  # the first row that decodes gives the shape and dtype of every row
            head = None
            while first < n and head is None:
                if keep[first]:
                    head = self._decode_one(batch, col, fn, first, keep)
                first += 1
            if head is None:  # no row (or none that decodes)
                batch[col] = np.zeros((n, 0), dtype=np.uint8)
                continue
            out = np.zeros((n, *head.shape), dtype=head.dtype)
            out[first - 1] = head
            rest = range(first, n)
            if len(rest) > 1 and _pooled(values[first:]):
                self._decode_on_pool(batch, col, fn, rest, keep, out)
            else:
                self._decode_into(batch, col, fn, rest, keep, out)
            batch[col] = out

    def _decode_one(self, batch: dict[str, Any], col: str, fn: Callable, i: int, keep: np.ndarray) -> np.ndarray | None:
        """Row ``i`` of ``col`` decoded; None when it failed and is skipped (``keep[i]`` set False)."""
        try:
            return np.asarray(fn(batch[col][i]))
        except Exception as exc:
            if self.on_decode_error != "skip":
                raise DataError(f"decode_fn of column {col!r} failed on {self._where(batch, i)}: "
                                f"{type(exc).__name__}: {exc} (on_decode_error='skip' skips such rows)") from exc
            keep[i] = False
            with self._lock:
                self.skipped += 1
                count = self.skipped
            if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th... skipped row
                logger.warning("decode_fn of column %r failed on %s (%s: %s): skipped "
                               "(on_decode_error='skip'; %d row(s) skipped so far)",
                               col, self._where(batch, i), type(exc).__name__, exc, count)
            return None

    def _decode_into(self, batch: dict[str, Any], col: str, fn: Callable, rows: Iterable[int], keep: np.ndarray,
                     out: np.ndarray) -> None:
        """Rows ``rows`` of ``col`` decoded into ``out`` (each must have ``out``'s row shape)."""
        for i in rows:
            if not keep[i]:
                continue
            arr = self._decode_one(batch, col, fn, i, keep)
            if arr is None:
                continue
            if arr.shape != out.shape[1:]:
                raise DataError(f"decode_fn of column {col!r} gives arrays of different shapes "
                                f"{sorted({tuple(out.shape[1:]), arr.shape})} in one batch ({self._where(batch, i)}); "
                                "make it return one shape (resize the images)")
            out[i] = arr

    def _decode_on_pool(self, batch: dict[str, Any], col: str, fn: Callable, rows: range, keep: np.ndarray,
                        out: np.ndarray) -> None:
        """:meth:`_decode_into` on the decoding threads, a contiguous part of ``rows`` each (Pillow
        releases the GIL while it decodes); the first failure (by row) is raised.

        Raises:
            DataError: a row failed (as :meth:`_decode_into`), or a part took longer than the
                reader timeout.
        """
        from hora.store.reader import reader_timeout

        parts = np.array_split(np.arange(rows.start, rows.stop), _POOL_THREADS)
        futures = [_pool().submit(self._decode_into, batch, col, fn, range(int(p[0]), int(p[-1]) + 1), keep, out)
                   for p in parts if len(p)]
        timeout = reader_timeout()
        errors = []
        for fut in futures:  # every part finishes (or times out) before the batch is given up
            try:
                fut.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                errors.append(DataError(f"decoding column {col!r}: a part of a batch took over {timeout:.0f} s"))
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _limit(self, col: str) -> int | None:
        return self.max_length.get(col)

    def _pad(self, batch: dict[str, Any], col: str, spec: ColumnSpec) -> None:
        rows = batch[col]
        limit = self._limit(col)
        if limit is not None and not self.truncation:
            for i, r in enumerate(rows):
                if len(r) > limit:
                    raise DataError(f"column {col!r} has a row of length {len(r)} ({self._where(batch, i)}), "
                                    f"longer than max_length={limit}, and truncation=False")
        padded, mask, cut = pad_rows(rows, spec.dtype, limit)
        if cut:
            with self._lock:
                before = self.truncated
                self.truncated += cut
            if before == 0 or (self.truncated.bit_length() > before.bit_length()):
                logger.warning("column %r: %d row(s) truncated to max_length=%d so far", col, self.truncated, limit)
        batch[col] = padded
        batch[col + MASK_SUFFIX] = mask

    def decode_rows(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The row-wise part of :meth:`__call__`: binary columns decoded (one array each), rows that
        failed dropped (``on_decode_error="skip"``); the rest as it came. Such batches can be
        concatenated and cut again (what ``inmemory_cache_all`` keeps, decoded once)."""
        batch = dict(batch)
        if not any(fn is not None and col in batch for col, fn in self.decode.items()):
            return batch
        n = len(next(iter(batch.values()))) if batch else 0
        keep = np.ones(n, dtype=bool)
        self._decode(batch, keep)
        if not keep.all():
            for c in list(batch):
                v = batch[c]
                batch[c] = [x for x, k in zip(v, keep) if k] if isinstance(v, list) else v[keep]
        return batch

    def finish(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch-wise part of :meth:`__call__`, on a batch from :meth:`decode_rows`:
        ``collate_fn``, or padding, sparse batches and masks."""
        batch = dict(batch)
        batch.pop(_ROW_ID, None)
        if self.collate_fn is not None:
            try:
                out = self.collate_fn(batch)
            except Exception as exc:
                raise DataError(f"collate_fn failed on a batch of columns {sorted(batch)}: "
                                f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(out, Mapping):
                raise DataError(f"collate_fn must return a dict of arrays (column -> array), got {type(out).__name__}")
            return dict(out)
        for col, v in list(batch.items()):
            spec = self.specs.get(col)
            if spec is None:
                continue
            if spec.kind == "ragged":
                self._pad(batch, col, spec)
            elif spec.kind == "sparse":
                csr = sparse_rows_to_csr(v, spec.size, spec.dtype)
                batch[col] = csr.toarray() if self.sparse_format == "dense" else csr
        for key, col in self.masks.items():
            if key not in batch and col in batch:
                arr = np.asarray(batch[col])
                batch[key] = np.ones(arr.shape[:2] if arr.ndim >= 2 else (len(arr), 1), dtype=bool)
        return batch

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self.finish(self.decode_rows(batch))


__all__ = ["ColumnOps", "CsrBatch", "decode_image", "decode_png_batch", "arrow_objects", "vector_batch", "DENSE_VECTOR_LIMIT", "pad_rows", "sparse_rows_to_csr", "DECODE_ERROR_MODES",
           "SPARSE_FORMATS", "MASK_SUFFIX"]
