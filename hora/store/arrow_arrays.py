"""Arrow columns of a stored dataset as the numpy arrays of a batch, vectorised (no per-row Python
for dense columns): numbers and fixed-size arrays as views or one copy, bytes, text, variable-length
and sparse rows as object arrays; feature groups stacked. Used by the reader and by transform's
Arrow batches (:func:`hora.store.columns.arrow_objects`)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyarrow as pa

from hora.errors import ConfigError, StoreError
from hora.store.dataset import ColumnSpec, DatasetInfo, group_dtype


#: Arrow's fixed-width numeric types and their numpy dtypes (read without Arrow's numpy conversion)
_PRIMITIVE = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
              pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
              pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


def arrow_values(arr: pa.Array) -> np.ndarray:
    """The values of a flat Arrow array as numpy: a view of its buffer for numeric arrays
    without nulls; otherwise Arrow's conversion (whose first use imports pandas, about a
    second of a rank's first batch, which is why the common case avoids it)."""
    dtype = _PRIMITIVE.get(arr.type)
    if dtype is not None and arr.null_count == 0:
        buf = arr.buffers()[1]
        if buf is not None:
            return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * np.dtype(dtype).itemsize)
    return arr.to_numpy(zero_copy_only=False)


def object_rows(col: pa.Array, spec: ColumnSpec) -> np.ndarray:
    """A non-dense column as a 1-d object array, one value per row: ``bytes`` (binary), ``str``
    (string), a 1-d array of ``spec.dtype`` (ragged; views of one buffer) or an
    ``(indices int32, values)`` pair (sparse)."""
    n = len(col)
    if spec.kind in ("binary", "string"):
        return col.to_numpy(zero_copy_only=False).astype(object, copy=False)
    out = np.empty(n, dtype=object)
    if spec.kind == "ragged":
        offsets = arrow_values(col.offsets) if col.offset == 0 else col.offsets.to_numpy()
        flat = arrow_values(col.values)
        if flat.dtype != np.dtype(spec.dtype):
            flat = flat.astype(spec.dtype)
        for i in range(n):
            out[i] = flat[offsets[i]:offsets[i + 1]]
        return out
    # sparse: struct<indices: list<int32>, values: list<dtype>>
    if col.offset:
        col = pa.concat_arrays([col])
    idx, val = col.field("indices"), col.field("values")
    offsets = arrow_values(idx.offsets)
    flat_i = arrow_values(idx.values)
    flat_v = arrow_values(val.values)
    if flat_v.dtype != np.dtype(spec.dtype):
        flat_v = flat_v.astype(spec.dtype)
    for i in range(n):
        out[i] = (flat_i[offsets[i]:offsets[i + 1]], flat_v[offsets[i]:offsets[i + 1]])
    return out


def row_bytes_of(spec: ColumnSpec) -> int:
    """About how many bytes one row of a column takes in memory (sizes the shuffle buffer and hand-overs):
    exact for dense columns; a guess for the others (a ragged row at its longest, 1 KiB of bytes or text)."""
    if spec.is_dense:
        return np.dtype(spec.dtype).itemsize * max(1, math.prod(spec.shape))
    if spec.kind == "ragged":
        return 100 + np.dtype(spec.dtype).itemsize * max(1, spec.shape[0] if spec.shape else 1)
    if spec.kind == "sparse":
        return 200
    return 1024


def column_to_numpy(col: pa.ChunkedArray | pa.Array, spec: ColumnSpec, name: str) -> np.ndarray:
    """Arrow column -> numpy ``(rows, *spec.shape)`` of ``spec.dtype``, vectorised (no per-row Python);
    a non-dense column as a 1-d object array (:func:`object_rows`)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if not spec.is_dense:
        return object_rows(col, spec)
    n = len(col)
    arr = col
    for _ in spec.shape:
        arr = arr.flatten()
    out = arrow_values(arr)
    if spec.shape:
        expected = n * math.prod(spec.shape)
        if out.size != expected:
            raise StoreError(
                f"column {name!r}: stored values do not match shape {spec.shape} ({out.size} values for {n} rows)"
            )
        out = out.reshape((n, *spec.shape))
    if out.dtype != np.dtype(spec.dtype):
        out = out.astype(spec.dtype)
    return out


def group_spec(info: DatasetInfo, key: str, members: Sequence[str]) -> ColumnSpec:
    """The spec of feature group ``key``: ``(len(members),)`` of its members' common dtype.

    Raises:
        ConfigError: a member is not stored, not a scalar column, or the dtypes differ.
    """
    if not members:
        raise ConfigError(f"feature group {key} has no columns")
    unknown = [m for m in members if m not in info.columns]
    if unknown:
        raise ConfigError(f"feature group {key}: columns {unknown} are not in the dataset; it has {list(info.columns)}")
    return ColumnSpec(dtype=group_dtype(key, {m: info.columns[m] for m in members}), shape=(len(members),))


def stack_members(members: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """The 1-d ``members`` side by side as the columns of ``out`` ``(rows, k)`` (a new array if None).

    One contiguous copy into a ``(k, rows)`` array, then one transposing copy into ``out``:
    about 8 x less CPU than writing each member into its strided column of ``out`` (which
    passes over all of ``out`` once per member), measured on 63,550 x 32 float32.
    """
    if out is None:
        out = np.empty((len(members[0]), len(members)), dtype=members[0].dtype)
    out[...] = np.vstack(members).T
    return out


def put_column(out: np.ndarray, col: np.ndarray | tuple[np.ndarray, ...]) -> None:
    """Writes one chunk column into ``out``: an array as it is, a group's members stacked."""
    if isinstance(col, tuple):
        stack_members(col, out)
    else:
        out[...] = col


__all__ = ["arrow_values", "object_rows", "row_bytes_of", "column_to_numpy", "group_spec", "stack_members",
           "put_column"]
