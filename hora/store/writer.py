"""The Parquet writer that runs where the data is: Spark tasks, Dask tasks or the driver.

:func:`write_part` writes one input partition of a materialization: it draws the
validation split, counts what the driver must check (NaN/null labels, nulls, array
shapes, validation values) and writes row groups of a fixed size into the attempt's
staging folder, returning its stats. The pandas helpers turn pandas frames (and Dask
partitions) into Arrow tables, arrays as nested lists.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hora.errors import DataError
from hora.store.integrity import local_file_checksum
from hora.store.layout import join
from hora.store.store import Store

#: Target uncompressed bytes per Parquet row group when ``rows_per_row_group`` is not given.
TARGET_ROW_GROUP_BYTES = 8 << 20
MIN_ROWS_PER_ROW_GROUP = 1024
MAX_ROWS_PER_ROW_GROUP = 1 << 20
#: Each written file's checksum and Parquet's page CRCs (hora.store.integrity); off only where
#: benchmarks/bench_checksums.py measures what they cost
CHECKSUMS = True


# --------------------------------------------------------------------------------------
# the writer (runs in Spark tasks, Dask tasks, or the driver)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WritePlan:
    store: Store
    tmp_dir: str
    attempt: str
    columns: tuple[str, ...]
    label_cols: tuple[str, ...]
    weight_col: str | None
    val_col: str | None
    val_frac: float
    seed: int
    label_nan: str
    rows_per_row_group: int | None
    #: Spark ML vector columns stored sparse (``compress_sparse_cols``): indices int32 + values
    sparse_cols: tuple[str, ...] = ()
    #: float dtype of the values of sparse columns
    vector_dtype: str = "float32"


def _list_shape(arr: pa.Array) -> tuple[list[int] | None, bool]:
    """(shape of one row, variable?) of a (nested) list array; shape None when it has no rows."""
    dims: list[int] = []
    a = arr
    while pa.types.is_list(a.type) or pa.types.is_large_list(a.type) or pa.types.is_fixed_size_list(a.type):
        if len(a) == 0:
            return None, False
        lens = pc.list_value_length(a).to_numpy(zero_copy_only=False)
        first = lens[0]
        if (lens != first).any():
            return None, True
        dims.append(int(first))
        a = a.flatten()
    return dims, False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def sparse_struct(col: pa.ChunkedArray | pa.Array, name: str, dtype: str = "float32") -> tuple[pa.Array, int]:
    """A Spark ML vector column as Arrow has it (``struct<type, size, indices, values>``) -> the
    stored sparse form ``struct<indices: list<int32>, values: list<dtype>>``, and the vectors' size.

    Dense vectors (``type`` 1) get ``indices`` 0..n-1. Nulls stay null (reported by the writer).

    Raises:
        DataError: the column is not a vector column, or its vectors have different sizes.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_struct(col.type) or {col.type.field(i).name for i in range(col.type.num_fields)} != {
            "type", "size", "indices", "values"}:
        raise DataError(f"column {name!r} of type {col.type} is not a Spark ML vector column; "
                        "compress_sparse_cols stores ML vector columns only")
    if col.offset or col.null_count:  # flatten the struct's own validity into its children's view
        col = pa.concat_arrays([col])
    typ = col.field("type").fill_null(0).to_numpy(zero_copy_only=False)
    indices = col.field("indices")
    values = col.field("values")
    sizes = col.field("size").to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    dense = (typ == 1) & valid
    if dense.any():
        rows = indices.to_pylist()
        for i in np.flatnonzero(dense):
            rows[i] = list(range(int(lengths[i])))
        indices = pa.array(rows, type=pa.list_(pa.int32()))
        sizes = np.where(dense, lengths, sizes)
    dims = np.asarray(sizes[valid], dtype=np.int64) if valid.any() else np.zeros(0, np.int64)
    size = int(dims.max()) if len(dims) else 0
    if len(dims) and int(dims.min()) != size:
        raise DataError(f"column {name!r} holds ML vectors of different sizes ({int(dims.min())} and {size}); "
                        "hora needs one size per vector column")
    out = pa.StructArray.from_arrays(
        [indices.cast(pa.list_(pa.int32())), values.cast(pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))],
        names=["indices", "values"], mask=pa.array(~valid) if not valid.all() else None)
    return out, size


def is_sparse_type(t: pa.DataType) -> bool:
    """The stored sparse form of :func:`sparse_struct`."""
    return pa.types.is_struct(t) and t.num_fields == 2 and t.field(0).name == "indices" and t.field(1).name == "values"


def _leaf(arr: pa.Array) -> pa.Array:
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten()
    return arr


def _row_nan_mask(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per-row True where the value is null or (for floats) holds a NaN anywhere."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    n = len(col)
    bad = col.is_null().to_numpy(zero_copy_only=False).copy() if col.null_count else np.zeros(n, bool)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        # push the check down to the leaves and map leaf positions back to rows
        parents = pc.list_parent_indices(col).to_numpy()
        inner = col.flatten()
        inner_bad = _row_nan_mask(inner)
        if inner_bad.any():
            bad[np.unique(parents[inner_bad])] = True
        return bad
    if pa.types.is_floating(col.type):
        vals = col.to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad |= np.isnan(vals)
    return bad


class SplitWriter:
    """Writes one split of one part: row groups of exactly ``rows_per_group`` rows (the last may be short)."""

    def __init__(self, plan: WritePlan, split: str, part: int, suffix: str) -> None:
        self.plan = plan
        self.split = split
        self.rel = f"{split}/part-{part:05d}-{plan.attempt}{suffix}.parquet"
        self.path = join(plan.tmp_dir, self.rel)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.row_groups: list[int] = []
        self.rows_per_group: int | None = plan.rows_per_row_group
        self._writer: pq.ParquetWriter | None = None
        self._spool: str | None = None  # the local file a remote part is written to before its upload
        self._sums: dict[str, Any] = {}  # the written file's size and checksum (hora.store.integrity)

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self.rows_per_group is None:
            per_row = max(1, table.nbytes // max(1, table.num_rows))
            self.rows_per_group = int(
                min(MAX_ROWS_PER_ROW_GROUP, max(MIN_ROWS_PER_ROW_GROUP, TARGET_ROW_GROUP_BYTES // per_row))
            )
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= self.rows_per_group:
            self._flush(final=False)

    def _open(self, schema: pa.Schema) -> None:
        store = self.plan.store
        if store.is_local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            where: str = self.path
        else:
            # a remote file is spooled to a local temporary file and uploaded whole at close: the
            # upload is one retried Store operation (a transient failure mid-stream cannot lose the
            # part), and the object appears complete or not at all
            fd, self._spool = tempfile.mkstemp(prefix="hora-part-", suffix=".parquet")
            os.close(fd)
            where = self._spool
        # each page carries Parquet's own CRC, which the reader checks on every page it reads; the
        # whole file's checksum is taken when it is closed (hora.store.integrity)
        self._writer = pq.ParquetWriter(where, schema, compression="snappy", use_dictionary=False,
                                        write_statistics=False, write_page_checksum=CHECKSUMS)

    def _flush(self, final: bool) -> None:
        if not self.pending:
            return
        table = pa.concat_tables(self.pending) if len(self.pending) > 1 else self.pending[0]
        rg = self.rows_per_group or table.num_rows
        full = (table.num_rows // rg) * rg
        upto = table.num_rows if final else full
        if upto == 0:
            return
        if self._writer is None:
            self._open(table.schema)
        start = 0
        while start < upto:
            stop = min(start + rg, upto)
            self._writer.write_table(table.slice(start, stop - start), row_group_size=stop - start)
            self.row_groups.append(stop - start)
            start = stop
        rest = table.slice(upto)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows

    def close(self) -> dict[str, Any] | None:
        self._flush(final=True)
        if self._writer is None:
            return None
        self._writer.close()
        if CHECKSUMS:  # before an upload: the bytes as written here, from the page cache
            checksum, size = local_file_checksum(self._spool or self.path)
            self._sums = {"size": size, "checksum": checksum}
        if self._spool is not None:
            try:
                self.plan.store.upload(self._spool, self.path)
            finally:
                os.unlink(self._spool)
                self._spool = None
        return {"path": self.rel, "rows": sum(self.row_groups), "row_groups": self.row_groups, **self._sums}

    def abort(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:  # pragma: no cover
            pass
        if self._spool is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._spool)
            self._spool = None


def _track_ragged(stats: dict[str, Any], name: str, col: pa.Array) -> None:
    """Record the longest row of a variable-length list column and the nulls among its values."""
    if col.null_count or len(col) == 0:
        return
    longest = pc.max(pc.list_value_length(col)).as_py() or 0
    stats["max_len"][name] = max(stats["max_len"].get(name, 0), int(longest))
    if _is_list(col.type):
        leaf = _leaf(col)
        if leaf.null_count:
            stats["nulls"][name] = stats["nulls"].get(name, 0) + leaf.null_count


def write_part(plan: WritePlan, part: int, tables: Iterable[pa.Table | pa.RecordBatch], suffix: str = "") -> dict:
    """Write one input partition: split it, check it, write its train/val files; return its stats."""
    stats: dict[str, Any] = {
        "part": part, "rows_in": 0, "dropped": 0, "files": {}, "shapes": {}, "variable": [],
        "types": {}, "nulls": {}, "label_nan": {}, "bad_validation": 0, "bad_validation_examples": [],
        "max_len": {}, "sparse_size": {}, "nnz": {},
    }
    writers = {"train": SplitWriter(plan, "train", part, suffix), "val": SplitWriter(plan, "val", part, suffix)}
    rng = np.random.default_rng([plan.seed, part]) if plan.val_frac > 0 else None
    try:
        for chunk in tables:
            table = pa.Table.from_batches([chunk]) if isinstance(chunk, pa.RecordBatch) else chunk
            n = table.num_rows
            if n == 0:
                continue
            for c in plan.sparse_cols:
                sparse, size = sparse_struct(table.column(c), c, plan.vector_dtype)
                table = table.set_column(table.schema.get_field_index(c), c, sparse)
                if size != stats["sparse_size"].setdefault(c, size):
                    raise DataError(f"column {c!r} holds ML vectors of different sizes ({size} and "
                                    f"{stats['sparse_size'][c]}); hora needs one size per vector column")
                stats["nnz"][c] = stats["nnz"].get(c, 0) + int(len(sparse.field("values").flatten()))
            stats["rows_in"] += n
            # validation mask (computed on every input row, before any drop, for determinism)
            if plan.val_col is not None:
                vcol = table.column(plan.val_col).combine_chunks()
                nulls = vcol.null_count
                vals = vcol.fill_null(False if pa.types.is_boolean(vcol.type) else 2).to_numpy(zero_copy_only=False)
                if pa.types.is_boolean(vcol.type):
                    is_val = vals.astype(bool)
                    bad = np.zeros(n, bool)
                else:
                    with np.errstate(invalid="ignore"):
                        bad = ~np.isin(vals, (0, 1))
                    is_val = vals == 1
                if nulls:
                    bad |= vcol.is_null().to_numpy(zero_copy_only=False)
                if bad.any():
                    stats["bad_validation"] += int(bad.sum())
                    if len(stats["bad_validation_examples"]) < 5:
                        ex = vcol.filter(pa.array(bad)).slice(0, 5).to_pylist()
                        stats["bad_validation_examples"].extend(repr(v) for v in ex)
                    is_val = is_val & ~bad
                table = table.drop_columns([plan.val_col])
            elif rng is not None:
                is_val = rng.random(n) < plan.val_frac
            else:
                is_val = None
            # label NaN / null
            keep = None
            for c in plan.label_cols:
                badrows = _row_nan_mask(table.column(c))
                cnt = int(badrows.sum())
                if cnt:
                    stats["label_nan"][c] = stats["label_nan"].get(c, 0) + cnt
                    if plan.label_nan == "drop":
                        keep = ~badrows if keep is None else keep & ~badrows
            if keep is not None and not keep.all():
                stats["dropped"] += int((~keep).sum())
                mask = pa.array(keep)
                table = table.filter(mask)
                if is_val is not None:
                    is_val = is_val[keep]
            # nulls, shapes, types
            for c in plan.columns:
                col = table.column(c)
                if col.null_count:
                    stats["nulls"][c] = stats["nulls"].get(c, 0) + col.null_count
                stats["types"].setdefault(c, str(col.type))
                if _is_list(col.type):
                    if c in stats["variable"]:
                        _track_ragged(stats, c, col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
                        continue
                    combined = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
                    if combined.null_count:
                        continue  # reported as nulls
                    shape, variable = _list_shape(combined)
                    if variable or (shape is not None and stats["shapes"].get(c, shape) != shape):
                        stats["variable"].append(c)
                        _track_ragged(stats, c, combined)
                    elif shape is not None:
                        stats["shapes"][c] = shape
                        leaf = _leaf(combined)
                        if leaf.null_count:
                            stats["nulls"][c] = stats["nulls"].get(c, 0) + leaf.null_count
            table = table.select(list(plan.columns))
            if is_val is None:
                writers["train"].add(table)
            else:
                if is_val.any():
                    writers["val"].add(table.filter(pa.array(is_val)))
                if not is_val.all():
                    writers["train"].add(table.filter(pa.array(~is_val)))
        for split, w in writers.items():
            stats["files"][split] = w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return stats


# --------------------------------------------------------------------------------------
# conversion of pandas data (pandas frames and Dask partitions)
# --------------------------------------------------------------------------------------
def pandas_column_kind(name: str, series: Any) -> str:
    """'scalar', 'array', 'binary' or 'string' for a supported pandas column; DataError otherwise.

    Arrays may differ in length from row to row (stored as variable-length lists).
    """
    import pandas as pd

    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype) or (
        pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
    ):
        return "scalar"
    if dtype == object:
        sample = series.dropna()
        if len(sample) == 0:
            return "array"  # all null: reported as nulls by the writer
        first = sample.iloc[0]
        if isinstance(first, (bytes, bytearray, memoryview)):
            return "binary"
        if isinstance(first, str):
            return "string"
        if isinstance(first, (np.ndarray, list, tuple)):
            arr = np.asarray(first)
            if arr.dtype.kind in "biuf":
                return "array"
            raise DataError(f"column {name!r} holds arrays of {arr.dtype}; hora needs arrays of numbers")
        raise DataError(
            f"column {name!r} holds {type(first).__name__} values; hora can feed numeric/boolean scalars, "
            "numeric arrays (fixed or variable length), bytes and strings to a model"
        )
    if pd.api.types.is_string_dtype(dtype):
        return "string"
    raise DataError(
        f"column {name!r} has dtype {dtype}; hora can feed numeric/boolean scalars, numeric arrays "
        "(fixed or variable length), bytes and strings to a model"
    )


def _ndarray_to_list_array(values: np.ndarray) -> pa.Array:
    """(n, d1, d2, ...) ndarray -> nested plain list array with the same shape per row (no per-row Python)."""
    shape = values.shape
    arr: pa.Array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for level in range(len(shape) - 1, 0, -1):
        count = int(np.prod(shape[:level]))  # lists at this level
        offsets = pa.array(np.arange(count + 1, dtype=np.int32) * shape[level])
        arr = pa.ListArray.from_arrays(offsets, arr)
    return arr


def _ragged_list_array(rows: list[np.ndarray], name: str) -> pa.Array:
    """Rows of numbers of different lengths -> a list array keeping their dtype (nested rows via Python lists)."""
    if any(r.ndim != 1 for r in rows) or len({r.dtype for r in rows}) > 1:
        return pa.array([r.tolist() for r in rows])
    if rows[0].dtype.kind not in "biuf":
        raise DataError(f"column {name!r} holds arrays of {rows[0].dtype}; hora needs arrays of numbers")
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(rows)))


def _pandas_to_arrow(pdf: Any, kinds: dict[str, str]) -> pa.Table:
    """Convert the given columns of a pandas frame (arrays as nested lists) to an Arrow table."""
    import pandas as pd

    arrays, names = [], []
    for c, kind in kinds.items():
        s = pdf[c]
        if kind in ("binary", "string"):
            objs = [None if o is None or o is getattr(pd, "NA", None) or (isinstance(o, float) and math.isnan(o)) else
                    (bytes(o) if kind == "binary" else str(o)) for o in s.to_numpy(dtype=object)]
            arrays.append(pa.array(objs, type=pa.binary() if kind == "binary" else pa.string()))
            names.append(c)
            continue
        if kind == "scalar":
            if isinstance(s.dtype, np.dtype) and s.dtype.kind in "biuf":
                arrays.append(pa.array(s.to_numpy(), from_pandas=False))  # NaN stays NaN
            else:  # nullable extension dtypes
                arrays.append(pa.array(s, from_pandas=True))
        else:
            objs = s.to_numpy()
            isnull = np.fromiter((o is None or (isinstance(o, float) and math.isnan(o)) for o in objs), bool, len(objs))
            if len(objs) == 0:
                arrays.append(pa.nulls(0, pa.list_(pa.float32())))
                names.append(c)
                continue
            if isnull.any():
                # nulls inside an array column: keep them as nulls, the writer reports the count
                arrays.append(pa.array([None if nul else np.asarray(o).tolist() for o, nul in zip(objs, isnull)]))
            else:
                try:
                    stacked = np.stack([np.asarray(o) for o in objs])
                except ValueError:
                    # variable lengths: lists of the rows' own dtype (1-d: one buffer, no per-value Python);
                    # the writer records them as a ragged column, or reports nested ones by name
                    arrays.append(_ragged_list_array([np.asarray(o) for o in objs], c))
                else:
                    if stacked.dtype.kind not in "biuf":
                        raise DataError(f"column {c!r} holds arrays of {stacked.dtype}; hora needs arrays of numbers")
                    arrays.append(_ndarray_to_list_array(stacked))
        names.append(c)
    return pa.Table.from_arrays(arrays, names=names)


def write_pandas_part(plan: WritePlan, part: int, pdf: Any, kinds: dict[str, str]) -> dict:
    return write_part(plan, part, [_pandas_to_arrow(pdf, kinds)])


__all__ = ["WritePlan", "SplitWriter", "write_part", "write_pandas_part", "pandas_column_kind"]
