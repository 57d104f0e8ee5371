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
from hora.store.layout import join
from hora.store.store import Store

#: Target uncompressed bytes per Parquet row group when ``rows_per_row_group`` is not given.
TARGET_ROW_GROUP_BYTES = 8 << 20
MIN_ROWS_PER_ROW_GROUP = 1024
MAX_ROWS_PER_ROW_GROUP = 1 << 20


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
            where: Any = self.path
        else:
            # a remote file is spooled to a local temporary file and uploaded whole at close: the
            # upload is one retried Store operation (a transient failure mid-stream cannot lose the
            # part), and the object appears complete or not at all
            fd, self._spool = tempfile.mkstemp(prefix="hora-part-", suffix=".parquet")
            os.close(fd)
            where = self._spool
        self._writer = pq.ParquetWriter(where, schema, compression="snappy", use_dictionary=False,
                                        write_statistics=False)

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
        if self._spool is not None:
            try:
                self.plan.store.upload(self._spool, self.path)
            finally:
                os.unlink(self._spool)
                self._spool = None
        return {"path": self.rel, "rows": sum(self.row_groups), "row_groups": self.row_groups}

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


def write_part(plan: WritePlan, part: int, tables: Iterable[pa.Table | pa.RecordBatch], suffix: str = "") -> dict:
    """Write one input partition: split it, check it, write its train/val files; return its stats."""
    stats: dict[str, Any] = {
        "part": part, "rows_in": 0, "dropped": 0, "files": {}, "shapes": {}, "variable": [],
        "types": {}, "nulls": {}, "label_nan": {}, "bad_validation": 0, "bad_validation_examples": [],
    }
    writers = {"train": SplitWriter(plan, "train", part, suffix), "val": SplitWriter(plan, "val", part, suffix)}
    rng = np.random.default_rng([plan.seed, part]) if plan.val_frac > 0 else None
    try:
        for chunk in tables:
            table = pa.Table.from_batches([chunk]) if isinstance(chunk, pa.RecordBatch) else chunk
            n = table.num_rows
            if n == 0:
                continue
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
                if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
                    if c in stats["variable"]:
                        continue
                    combined = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
                    if combined.null_count:
                        continue  # reported as nulls
                    shape, variable = _list_shape(combined)
                    if variable or (shape is not None and stats["shapes"].get(c, shape) != shape):
                        stats["variable"].append(c)
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
    """'scalar' or 'array' for a supported pandas column; DataError otherwise."""
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
        if isinstance(first, (np.ndarray, list, tuple)):
            arr = np.asarray(first)
            if arr.dtype.kind in "biuf":
                return "array"
            raise DataError(f"column {name!r} holds arrays of {arr.dtype}; hora needs arrays of numbers")
        raise DataError(
            f"column {name!r} holds {type(first).__name__} values; hora can feed numeric/boolean scalars "
            "and fixed-shape numeric arrays to a model (encode strings to numbers first)"
        )
    hint = ""
    if pd.api.types.is_string_dtype(dtype):
        hint = (" (encode strings to numbers first; if the column held arrays in a Dask frame, Dask's "
                "'dataframe.convert-string' setting turned them into strings: build the frame under "
                "dask.config.set({'dataframe.convert-string': False}))")
    raise DataError(
        f"column {name!r} has dtype {dtype}; hora can feed numeric/boolean scalars and "
        f"fixed-shape numeric arrays to a model{hint}"
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


def _pandas_to_arrow(pdf: Any, kinds: dict[str, str]) -> pa.Table:
    """Convert the given columns of a pandas frame (arrays as nested lists) to an Arrow table."""
    arrays, names = [], []
    for c, kind in kinds.items():
        s = pdf[c]
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
                    # ragged: keep as (variable) lists; the writer reports it with the column name
                    arrays.append(pa.array([np.asarray(o).tolist() for o in objs]))
                else:
                    if stacked.dtype.kind not in "biuf":
                        raise DataError(f"column {c!r} holds arrays of {stacked.dtype}; hora needs arrays of numbers")
                    arrays.append(_ndarray_to_list_array(stacked))
        names.append(c)
    return pa.Table.from_arrays(arrays, names=names)


def write_pandas_part(plan: WritePlan, part: int, pdf: Any, kinds: dict[str, str]) -> dict:
    return write_part(plan, part, [_pandas_to_arrow(pdf, kinds)])


__all__ = ["WritePlan", "SplitWriter", "write_part", "write_pandas_part", "pandas_column_kind"]
