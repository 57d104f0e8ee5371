"""Materialize a Spark, Dask or pandas DataFrame to sharded Parquet in a Store, once.

:func:`materialize` keeps only the needed columns, turns Spark ML vectors into
fixed-length float arrays, splits off a validation set, writes
``datasets/<fingerprint>/{train,val}/part-*.parquet`` (plain Parquet, list columns for
arrays, readable by petastorm and Spark) plus ``_metadata.json``, and commits by
writing a marker last. A committed dataset with the same fingerprint is reused.

How each engine writes:

* Spark: ``mapInArrow`` runs hora's Parquet writer inside the tasks (one pass over
  the data, no sort, no shuffle unless the frame has fewer partitions than
  ``num_proc``), through the pickled Store (any fsspec URL the executors can reach).
* Dask: one writer task per partition, through the active scheduler.
* pandas: written in-process, cut into ``num_proc`` balanced files per split.
* ``memory://`` stores live in one process, so Spark/Dask data is collected to the
  driver and written there.

Each writer counts what must be checked (NaN/null labels, nulls, array shapes,
validation values), so bad data costs no extra pass: the driver checks the counts,
and a failed check removes the attempt and raises :class:`~hora.errors.DataError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hora.errors import ConfigError, DataError, StoreError
from hora.store.dataset import FORMAT_VERSION, ColumnSpec, DatasetInfo, FileInfo
from hora.store.layout import COMMIT_MARKER, TMP_PREFIX, join
from hora.store.store import Store

logger = logging.getLogger(__name__)

#: Target uncompressed bytes per Parquet row group when ``rows_per_row_group`` is not given.
TARGET_ROW_GROUP_BYTES = 8 << 20
MIN_ROWS_PER_ROW_GROUP = 1024
MAX_ROWS_PER_ROW_GROUP = 1 << 20
#: Fault injection for tests: seconds to sleep after the data is written, before the commit.
FAULT_SLEEP_BEFORE_COMMIT_ENV = "HORA_FAULT_MATERIALIZE_SLEEP_BEFORE_COMMIT"

_LABEL_NAN_MODES = ("error", "drop", "keep")
_VECTOR_DTYPES = ("float32", "float64")


# --------------------------------------------------------------------------------------
# public
# --------------------------------------------------------------------------------------
def materialize(
    df: Any,
    store: Store,
    feature_cols: Sequence[str],
    label_cols: Sequence[str] = (),
    sample_weight_col: str | None = None,
    validation: float | str | None = None,
    num_proc: int = 1,
    seed: int = 42,
    label_nan: str = "error",
    vector_dtype: str = "float32",
    rows_per_row_group: int | None = None,
    overwrite: bool = False,
) -> DatasetInfo:
    """Write the needed columns of ``df`` to ``store`` as train/val Parquet, or reuse a committed copy.

    Args:
        df: a ``pyspark.sql.DataFrame``, a ``dask.dataframe.DataFrame`` or a ``pandas.DataFrame``.
        store: where to write (``store.layout.dataset_dir(fingerprint)``).
        feature_cols, label_cols, sample_weight_col: the columns to keep. Supported types:
            numeric or boolean scalars, Spark ML vectors (dense or sparse), and (nested)
            arrays of numbers with a fixed shape (numpy arrays or lists in pandas/Dask).
        validation: None (no validation split), a fraction in [0, 1) drawn by seeded
            random per row, or the name of a boolean / 0-1 column (true = validation row;
            the column itself is not stored).
        num_proc: training processes; each split gets at least this many files
            (when it has that many rows).
        seed: seed of the random validation split.
        label_nan: ``"error"`` (default): NaN or null in a label column raises DataError;
            ``"drop"``: such rows are dropped; ``"keep"``: NaN is kept (null still fails).
        vector_dtype: float dtype of Spark ML vectors once stored as arrays.
        rows_per_row_group: Parquet row group size (default: about 8 MiB of data per group).
        overwrite: rewrite even when a committed dataset with the same fingerprint exists.

    Returns:
        the :class:`DatasetInfo` (``info.reused`` tells whether it was found committed).

    Raises:
        DataError: missing columns, unsupported column types, empty frame or split,
            variable-length arrays, a validation column with other values, NaN/null labels,
            null features.
        ConfigError: bad options (fraction outside [0, 1), num_proc < 1...).
        StoreError: the store cannot be written.
    """
    t0 = time.perf_counter()
    if not isinstance(store, Store):
        raise ConfigError(f"store must be a hora.store.Store, got {type(store).__name__}")
    feature_cols = _names("feature_cols", feature_cols, allow_empty=False)
    label_cols = _names("label_cols", label_cols, allow_empty=True)
    if sample_weight_col is not None and (not isinstance(sample_weight_col, str) or not sample_weight_col):
        raise ConfigError(f"sample_weight_col must be a column name or None, got {sample_weight_col!r}")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"num_proc must be an int >= 1, got {num_proc!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    if label_nan not in _LABEL_NAN_MODES:
        raise ConfigError(f"label_nan must be one of {_LABEL_NAN_MODES}, got {label_nan!r}")
    if vector_dtype not in _VECTOR_DTYPES:
        raise ConfigError(f"vector_dtype must be one of {_VECTOR_DTYPES}, got {vector_dtype!r}")
    if rows_per_row_group is not None and (
        isinstance(rows_per_row_group, bool) or not isinstance(rows_per_row_group, int) or rows_per_row_group < 1
    ):
        raise ConfigError(f"rows_per_row_group must be an int >= 1 or None, got {rows_per_row_group!r}")
    val_col, val_frac = _parse_validation(validation)

    stored = list(dict.fromkeys([*feature_cols, *label_cols, *([sample_weight_col] if sample_weight_col else [])]))
    if val_col is not None and val_col in stored:
        raise ConfigError(f"validation column {val_col!r} is also a feature/label/weight column")
    source = _make_source(df, vector_dtype)
    source.check_schema(stored, label_cols, sample_weight_col, val_col)

    options = {
        "feature_cols": list(feature_cols),
        "label_cols": list(label_cols),
        "sample_weight_col": sample_weight_col,
        "validation": validation,
        "num_proc": num_proc,
        "seed": seed,
        "label_nan": label_nan,
        "vector_dtype": vector_dtype,
        "rows_per_row_group": rows_per_row_group,
    }
    token_data = source.data_token(stored + ([val_col] if val_col else []))
    fp = _fingerprint(source.kind, token_data, options)
    logger.debug("materialize: fingerprint %s computed in %.3f s", fp, time.perf_counter() - t0)

    if not overwrite:
        found = load_dataset_info(store, fp)
        if found is not None:
            logger.info("materialize: reusing committed dataset %s (%d train / %d val rows)",
                        store.url_for(found.dataset_dir), found.train_rows, found.val_rows)
            return replace(found, reused=True)

    attempt = uuid.uuid4().hex[:12]
    plan = _WritePlan(
        store=store,
        tmp_dir=store.layout.tmp_dir(fp, attempt),
        attempt=attempt,
        columns=tuple(stored),
        label_cols=tuple(label_cols),
        weight_col=sample_weight_col,
        val_col=val_col,
        val_frac=val_frac,
        seed=seed,
        label_nan=label_nan,
        rows_per_row_group=rows_per_row_group,
    )
    t1 = time.perf_counter()
    try:
        stats = source.write(plan, num_proc, describe=f"hora: materialize {fp} ({len(stored)} columns) to {store.url}")
        info = _assemble(fp, store, plan, stats, source.kind, options, val_col is not None or val_frac > 0)
        info = _ensure_min_files(store, plan, info, num_proc)
        sleep = os.environ.get(FAULT_SLEEP_BEFORE_COMMIT_ENV)
        if sleep:
            logger.warning("fault injection: sleeping %s s before committing %s", sleep, fp)
            time.sleep(float(sleep))
        info = _commit(store, plan, info, overwrite)
    except BaseException:
        try:
            store.rm(plan.tmp_dir, recursive=True)
        except Exception as exc:  # pragma: no cover - best effort cleanup
            logger.warning("could not remove %s after a failed materialization: %s", plan.tmp_dir, exc)
        raise
    logger.info(
        "materialize: wrote %s (%d train rows in %d files, %d val rows in %d files) in %.2f s",
        store.url_for(info.dataset_dir), info.train_rows, len(info.train_files),
        info.val_rows, len(info.val_files), time.perf_counter() - t1,
    )
    return info


def load_dataset_info(store: Store, fingerprint: str) -> DatasetInfo | None:
    """The committed dataset with this fingerprint, or None when there is none (or it is incomplete).

    A dataset counts as committed only when its marker exists and names the exact
    metadata next to it (a content hash), so a half-written attempt is never reused.

    Raises:
        StoreError: the store cannot be read.
    """
    marker_path = store.layout.commit_marker(fingerprint)
    if not store.exists(marker_path):
        return None
    try:
        marker = json.loads(store.read_bytes(marker_path))
        raw = store.read_bytes(store.layout.metadata_path(fingerprint))
    except (StoreError, ValueError) as exc:
        logger.warning("dataset %s has a commit marker but unreadable metadata (%s); ignoring it", fingerprint, exc)
        return None
    if marker.get("metadata_sha256") != hashlib.sha256(raw).hexdigest():
        logger.warning("dataset %s: metadata does not match its commit marker; ignoring it", fingerprint)
        return None
    info = DatasetInfo.from_json(raw)
    if info.fingerprint != fingerprint:
        logger.warning("dataset %s: metadata names fingerprint %s; ignoring it", fingerprint, info.fingerprint)
        return None
    # The dataset may have been moved with its store: trust the layout, not the recorded dir.
    return replace(info, dataset_dir=store.layout.dataset_dir(fingerprint))


# --------------------------------------------------------------------------------------
# option parsing
# --------------------------------------------------------------------------------------
def _names(what: str, cols: Sequence[str] | str, allow_empty: bool) -> list[str]:
    if isinstance(cols, str):
        cols = [cols]
    try:
        cols = list(cols)
    except TypeError as exc:
        raise ConfigError(f"{what} must be a list of column names, got {cols!r}") from exc
    for c in cols:
        if not isinstance(c, str) or not c:
            raise ConfigError(f"{what} must hold non-empty column name strings, got {c!r}")
    if len(set(cols)) != len(cols):
        raise ConfigError(f"{what} lists a column twice: {cols}")
    if not cols and not allow_empty:
        raise ConfigError(f"{what} must name at least one column")
    return cols


def _parse_validation(validation: float | str | None) -> tuple[str | None, float]:
    if validation is None:
        return None, 0.0
    if isinstance(validation, str):
        if not validation:
            raise ConfigError("validation column name is empty")
        return validation, 0.0
    if isinstance(validation, bool) or not isinstance(validation, (int, float)):
        raise ConfigError(f"validation must be None, a fraction in [0, 1) or a column name, got {validation!r}")
    frac = float(validation)
    if not (0.0 <= frac < 1.0) or math.isnan(frac):
        raise ConfigError(f"validation fraction must be in [0, 1), got {validation!r}")
    return None, frac


def _fingerprint(kind: str, data_token: str, options: dict[str, Any]) -> str:
    payload = json.dumps(
        {"format": FORMAT_VERSION, "kind": kind, "data": data_token, "options": options},
        sort_keys=True, default=str,
    )
    return f"{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:24]}"


# --------------------------------------------------------------------------------------
# the writer (runs in Spark tasks, Dask tasks, or the driver)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _WritePlan:
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


class _SplitWriter:
    """Writes one split of one part: row groups of exactly ``rows_per_group`` rows (the last may be short)."""

    def __init__(self, plan: _WritePlan, split: str, part: int, suffix: str) -> None:
        self.plan = plan
        self.split = split
        self.rel = f"{split}/part-{part:05d}-{plan.attempt}{suffix}.parquet"
        self.path = join(plan.tmp_dir, self.rel)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.row_groups: list[int] = []
        self.rows_per_group: int | None = plan.rows_per_row_group
        self._writer: pq.ParquetWriter | None = None
        self._fh = None

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
            self._fh = None
            where: Any = self.path
        else:
            self._fh = store.open(self.path, "wb")
            where = self._fh
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
        if self._fh is not None:
            self._fh.close()
        return {"path": self.rel, "rows": sum(self.row_groups), "row_groups": self.row_groups}

    def abort(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
            if self._fh is not None:
                self._fh.close()
        except Exception:  # pragma: no cover
            pass


def _write_part(plan: _WritePlan, part: int, tables: Iterable[pa.Table | pa.RecordBatch], suffix: str = "") -> dict:
    """Write one input partition: split it, check it, write its train/val files; return its stats."""
    stats: dict[str, Any] = {
        "part": part, "rows_in": 0, "dropped": 0, "files": {}, "shapes": {}, "variable": [],
        "types": {}, "nulls": {}, "label_nan": {}, "bad_validation": 0, "bad_validation_examples": [],
    }
    writers = {"train": _SplitWriter(plan, "train", part, suffix), "val": _SplitWriter(plan, "val", part, suffix)}
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
def _pandas_column_kind(name: str, series: Any) -> str:
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


def _write_pandas_part(plan: _WritePlan, part: int, pdf: Any, kinds: dict[str, str]) -> dict:
    return _write_part(plan, part, [_pandas_to_arrow(pdf, kinds)])


# --------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------
class _Source:
    kind = "?"

    def check_schema(self, stored: list[str], label_cols: Sequence[str], weight: str | None, val_col: str | None) -> None:
        raise NotImplementedError

    def data_token(self, cols: list[str]) -> str:
        raise NotImplementedError

    def write(self, plan: _WritePlan, num_proc: int, describe: str) -> list[dict]:
        raise NotImplementedError


def _missing(cols: Iterable[str], available: Sequence[str]) -> None:
    missing = [c for c in cols if c not in available]
    if missing:
        raise DataError(f"column(s) {missing} not found in the DataFrame; it has {list(available)}")


def _check_scalar_role(name: str, kind: str, role: str) -> None:
    if kind != "scalar":
        raise DataError(f"{role} column {name!r} must hold numeric/boolean scalars, not arrays")


class _PandasSource(_Source):
    kind = "pandas"

    def __init__(self, df: Any) -> None:
        self.df = df
        self.kinds: dict[str, str] = {}

    def check_schema(self, stored, label_cols, weight, val_col):
        all_cols = stored + ([val_col] if val_col else [])
        _missing(all_cols, [str(c) for c in self.df.columns])
        if len(self.df) == 0:
            raise DataError("the DataFrame is empty (0 rows)")
        self.kinds = {c: _pandas_column_kind(c, self.df[c]) for c in stored}
        if weight:
            _check_scalar_role(weight, self.kinds[weight], "sample weight")
        if val_col:
            _check_scalar_role(val_col, _pandas_column_kind(val_col, self.df[val_col]), "validation")

    def data_token(self, cols):
        import pandas as pd

        h = hashlib.sha256()
        h.update(str(len(self.df)).encode())
        for c in cols:
            s = self.df[c]
            h.update(f"|{c}|{s.dtype}|".encode())
            if s.dtype == object:
                for v in s.to_numpy():
                    a = np.asarray(v) if v is not None else np.asarray([])
                    h.update(str(a.dtype).encode() + str(a.shape).encode())
                    h.update(np.ascontiguousarray(a).tobytes())
            else:
                h.update(pd.util.hash_pandas_object(s, index=False).to_numpy().tobytes())
        return h.hexdigest()

    def write(self, plan, num_proc, describe):
        n = len(self.df)
        bounds = np.linspace(0, n, num_proc + 1).astype(int)
        cols = list(self.kinds) + ([plan.val_col] if plan.val_col else [])
        kinds = dict(self.kinds)
        if plan.val_col:
            kinds[plan.val_col] = "scalar"
        out = []
        for i in range(num_proc):
            part = self.df.iloc[bounds[i] : bounds[i + 1]][cols]
            out.append(_write_pandas_part(plan, i, part, kinds))
        return out


class _DaskSource(_Source):
    kind = "dask"

    def __init__(self, ddf: Any) -> None:
        self.ddf = ddf
        self.kinds: dict[str, str] = {}

    def check_schema(self, stored, label_cols, weight, val_col):
        all_cols = stored + ([val_col] if val_col else [])
        _missing(all_cols, [str(c) for c in self.ddf.columns])
        meta = self.ddf._meta
        objects = [c for c in all_cols if meta[c].dtype == object]
        sample = None
        if objects:
            sample = self.ddf[objects].head(1, npartitions=-1)
        for c in all_cols:
            series = sample[c] if (sample is not None and c in objects) else meta[c]
            kind = _pandas_column_kind(c, series)
            if c == val_col:
                _check_scalar_role(c, kind, "validation")
            else:
                self.kinds[c] = kind
        if weight:
            _check_scalar_role(weight, self.kinds[weight], "sample weight")

    def data_token(self, cols):
        from dask.base import tokenize

        return tokenize(self.ddf, cols)

    def write(self, plan, num_proc, describe):
        import dask

        cols = list(self.kinds) + ([plan.val_col] if plan.val_col else [])
        kinds = dict(self.kinds)
        if plan.val_col:
            kinds[plan.val_col] = "scalar"
        ddf = self.ddf[cols]
        if ddf.npartitions < num_proc:
            ddf = ddf.repartition(npartitions=num_proc)
        parts = ddf.to_delayed()
        if plan.store.protocol == "memory":
            # memory:// lives in this process only: bring the partitions here and write locally
            frames = dask.compute(*parts)
            return [_write_pandas_part(plan, i, f, kinds) for i, f in enumerate(frames)]
        write = dask.delayed(_write_pandas_part, pure=False)
        tasks = [write(plan, i, p, kinds, dask_key_name=f"hora-materialize-{plan.attempt}-{i}") for i, p in enumerate(parts)]
        return list(dask.compute(*tasks))


_SPARK_SCALARS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "BooleanType")


class _SparkSource(_Source):
    kind = "spark"

    def __init__(self, df: Any, vector_dtype: str) -> None:
        self.df = df
        self.vector_dtype = vector_dtype
        self.kinds: dict[str, str] = {}

    @staticmethod
    def _type_kind(dt: Any) -> str | None:
        from pyspark.sql import types as T

        name = type(dt).__name__
        if name == "VectorUDT":
            return "vector"
        if name in _SPARK_SCALARS:
            return "scalar"
        if isinstance(dt, T.ArrayType):
            inner = _SparkSource._type_kind(dt.elementType)
            return "array" if inner in ("scalar", "array") else None
        return None

    def check_schema(self, stored, label_cols, weight, val_col):
        fields = {f.name: f for f in self.df.schema.fields}
        all_cols = stored + ([val_col] if val_col else [])
        _missing(all_cols, list(fields))
        for c in all_cols:
            dt = fields[c].dataType
            kind = self._type_kind(dt)
            if kind is None:
                raise DataError(
                    f"column {c!r} has Spark type {dt.simpleString()}; hora can feed numeric/boolean "
                    "scalars, ML vectors and arrays of numbers to a model (index or encode it first)"
                )
            if c == val_col:
                _check_scalar_role(c, kind, "validation")
            else:
                self.kinds[c] = kind
        if weight:
            _check_scalar_role(weight, self.kinds[weight], "sample weight")

    def data_token(self, cols):
        df = self.df
        try:
            plan_hash = str(df.semanticHash())
        except Exception as exc:  # e.g. Spark Connect without the call
            raise DataError(f"cannot fingerprint this Spark DataFrame (semanticHash failed: {exc})") from exc
        try:
            files = sorted(df.inputFiles())
        except Exception:  # pragma: no cover - plans without a file index
            files = []
        return json.dumps({"plan": plan_hash, "files": files, "schema": df.schema.json(), "cols": cols})

    def _select(self, plan: _WritePlan):
        from pyspark.sql import functions as F

        exprs = []
        for c in plan.columns:
            if self.kinds[c] == "vector":
                from pyspark.ml.functions import vector_to_array

                exprs.append(vector_to_array(F.col(c), dtype=self.vector_dtype).alias(c))
            else:
                exprs.append(F.col(c))
        if plan.val_col:
            exprs.append(F.col(plan.val_col))
        return self.df.select(*exprs)

    def write(self, plan, num_proc, describe):
        sel = self._select(plan)
        sc = sel.sparkSession.sparkContext
        if plan.store.protocol == "memory":
            # memory:// lives in this process only: collect to the driver and write here
            sc.setJobDescription(describe + " (collect to driver for memory://)")
            try:
                table = sel.toArrow()
            finally:
                sc.setJobDescription(None)
            n = table.num_rows
            bounds = np.linspace(0, n, num_proc + 1).astype(int)
            return [_write_part(plan, i, [table.slice(bounds[i], bounds[i + 1] - bounds[i])]) for i in range(num_proc)]
        if sel.rdd.getNumPartitions() < num_proc:
            sel = sel.repartition(num_proc)

        def _task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            part = ctx.partitionId() if ctx else 0
            attempt = ctx.attemptNumber() if ctx else 0
            stats = _write_part(plan, part, batches, suffix=f"-a{attempt}" if attempt else "")
            yield pa.RecordBatch.from_pydict({"stats": [json.dumps(stats)]})

        sc.setJobDescription(describe)
        try:
            rows = sel.mapInArrow(_task, "stats string").collect()
        finally:
            sc.setJobDescription(None)
        return [json.loads(r["stats"]) for r in rows]


def _make_source(df: Any, vector_dtype: str) -> _Source:
    mod = type(df).__module__
    if mod.startswith("pyspark.sql"):
        from pyspark.sql import DataFrame as SparkDF

        if isinstance(df, SparkDF):
            return _SparkSource(df, vector_dtype)
    if mod.startswith("dask") or mod.startswith("dask_expr"):
        import dask.dataframe as dd

        if isinstance(df, dd.DataFrame):
            return _DaskSource(df)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(df, pd.DataFrame):
        return _PandasSource(df)
    raise DataError(
        f"cannot materialize a {type(df).__module__}.{type(df).__name__}: pass a Spark, Dask or pandas DataFrame"
    )


# --------------------------------------------------------------------------------------
# driver side: checks, assembly, commit
# --------------------------------------------------------------------------------------
def _assemble(fp: str, store: Store, plan: _WritePlan, stats: list[dict], kind: str,
              options: dict[str, Any], want_val: bool) -> DatasetInfo:
    rows_in = sum(s["rows_in"] for s in stats)
    if rows_in == 0:
        raise DataError("the DataFrame is empty (0 rows)")
    bad_val = sum(s["bad_validation"] for s in stats)
    if bad_val:
        examples = [e for s in stats for e in s["bad_validation_examples"]][:5]
        raise DataError(
            f"validation column {plan.val_col!r} must hold booleans or 0/1 without nulls; "
            f"{bad_val} rows hold other values (e.g. {', '.join(examples)})"
        )
    label_nan: dict[str, int] = {}
    for s in stats:
        for c, n in s["label_nan"].items():
            label_nan[c] = label_nan.get(c, 0) + n
    if label_nan and plan.label_nan == "error":
        detail = ", ".join(f"{c!r}: {n} of {rows_in} rows" for c, n in label_nan.items())
        raise DataError(
            f"NaN or null values in label column(s) {detail}; drop or fill them, or pass label_nan='drop'"
        )
    nulls: dict[str, int] = {}
    for s in stats:
        for c, n in s["nulls"].items():
            nulls[c] = nulls.get(c, 0) + n
    nulls = {c: n for c, n in nulls.items() if not (c in plan.label_cols and plan.label_nan == "drop")}
    if nulls:
        detail = ", ".join(f"{c!r}: {n}" for c, n in nulls.items())
        raise DataError(f"null values in column(s) {detail}; fill or drop them before fitting")
    variable = sorted({c for s in stats for c in s["variable"]})
    shapes: dict[str, list[int]] = {}
    for s in stats:
        for c, shape in s["shapes"].items():
            if c in shapes and shapes[c] != shape:
                variable.append(c)
            shapes.setdefault(c, shape)
    if variable:
        raise DataError(
            f"array column(s) {sorted(set(variable))} hold arrays of different lengths; hora needs one "
            "fixed shape per column (pad or truncate them)"
        )
    dropped = sum(s["dropped"] for s in stats)
    if dropped:
        logger.warning("materialize: dropped %d rows with NaN/null labels (label_nan='drop')", dropped)
    types = {}
    for s in stats:
        for c, t in s["types"].items():
            types.setdefault(c, t)
    files: dict[str, list[FileInfo]] = {"train": [], "val": []}
    for s in sorted(stats, key=lambda s: s["part"]):
        for split in ("train", "val"):
            f = s["files"].get(split)
            if f:
                files[split].append(FileInfo(path=f["path"], rows=f["rows"], row_groups=tuple(f["row_groups"])))
    if not files["train"]:
        raise DataError("the training split is empty (every row went to validation or was dropped)")
    if want_val and not files["val"]:
        raise DataError(
            f"the validation split is empty (validation={options['validation']!r} selected no rows); "
            "use a larger fraction or mark some rows"
        )
    # column specs from the first written file's schema (exact Arrow types) and the shapes
    first = files["train"][0]
    schema = _read_schema(store, join(plan.tmp_dir, first.path))
    columns: dict[str, ColumnSpec] = {}
    for c in plan.columns:
        t = schema.field(c).type
        depth = 0
        while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            t = t.value_type
            depth += 1
        try:
            dtype = np.dtype(t.to_pandas_dtype()).name
        except NotImplementedError as exc:
            raise DataError(f"column {c!r} has Arrow type {schema.field(c).type}, which hora cannot store") from exc
        shape = tuple(shapes.get(c, [0] * depth)) if depth else ()
        if len(shape) != depth:
            raise DataError(f"column {c!r}: shape {shape} does not match its {depth}-level nesting")
        columns[c] = ColumnSpec(dtype=dtype, shape=shape)
    return DatasetInfo(
        fingerprint=fp,
        dataset_dir=store.layout.dataset_dir(fp),
        columns=columns,
        feature_cols=tuple(options["feature_cols"]),
        label_cols=tuple(options["label_cols"]),
        sample_weight_col=options["sample_weight_col"],
        files={k: tuple(v) for k, v in files.items()},
        source=kind,
        options=options,
    )


def _read_schema(store: Store, path: str) -> pa.Schema:
    if store.is_local:
        return pq.read_schema(path)
    with store.open(path, "rb") as fh:
        return pq.read_schema(fh)


def _ensure_min_files(store: Store, plan: _WritePlan, info: DatasetInfo, num_proc: int) -> DatasetInfo:
    """Re-cut a split into ``num_proc`` balanced files when the engine produced fewer (streaming, row group by row group)."""
    new_files = dict(info.files)
    for split, files in info.files.items():
        rows = sum(f.rows for f in files)
        if not files or len(files) >= num_proc or rows < num_proc:
            continue
        logger.info("materialize: re-cutting %s split (%d files, %d rows) into %d files", split, len(files), rows, num_proc)
        bounds = np.linspace(0, rows, num_proc + 1).astype(int)
        target = [int(b) for b in np.diff(bounds)]
        rg = plan.rows_per_row_group
        out: list[FileInfo] = []
        writer: _SplitWriter | None = None
        idx, written = 0, 0

        def _new_writer(i: int) -> _SplitWriter:
            w = _SplitWriter(plan, split, i, "-r")
            w.rows_per_group = rg if rg is not None else files[0].row_groups[0]
            return w

        writer = _new_writer(0)
        for f in files:
            path = join(plan.tmp_dir, f.path)
            fh = None if store.is_local else store.open(path, "rb")
            try:
                pf = pq.ParquetFile(path if fh is None else fh)
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g)
                    while table.num_rows:
                        take = min(table.num_rows, target[idx] - written)
                        writer.add(table.slice(0, take))
                        written += take
                        table = table.slice(take)
                        if written == target[idx]:
                            res = writer.close()
                            out.append(FileInfo(path=res["path"], rows=res["rows"], row_groups=tuple(res["row_groups"])))
                            idx, written = idx + 1, 0
                            if idx < num_proc:
                                writer = _new_writer(idx)
            finally:
                if fh is not None:
                    fh.close()
            store.rm(path)
        new_files[split] = tuple(out)
    return replace(info, files=new_files)


def _commit(store: Store, plan: _WritePlan, info: DatasetInfo, overwrite: bool) -> DatasetInfo:
    fp = info.fingerprint
    layout = store.layout
    marker = layout.commit_marker(fp)
    if store.exists(marker):
        if not overwrite:
            found = load_dataset_info(store, fp)
            if found is not None:
                logger.info("materialize: %s was committed by another attempt meanwhile; using it", fp)
                store.rm(plan.tmp_dir, recursive=True)
                return found
        store.rm(marker)
    # Remove what an interrupted or replaced attempt left (never reused: no marker now).
    for split in ("train", "val"):
        store.rm(layout.split_dir(fp, split), recursive=True)
    store.rm(layout.metadata_path(fp))
    for entry in store.listdir(layout.dataset_dir(fp)):
        base = entry.rsplit("/", 1)[-1]
        if base.startswith(TMP_PREFIX) and entry.rstrip("/") != plan.tmp_dir.rstrip("/"):
            store.rm(entry, recursive=True)
    final_files: dict[str, tuple[FileInfo, ...]] = {}
    for split, files in info.files.items():
        if files:
            store.makedirs(layout.split_dir(fp, split))
        final_files[split] = files
        for f in files:
            store.mv(join(plan.tmp_dir, f.path), join(info.dataset_dir, f.path))
    store.rm(plan.tmp_dir, recursive=True)
    info = replace(info, files=final_files, reused=False)
    meta = info.to_json().encode("utf-8")
    store.write_bytes(layout.metadata_path(fp), meta)
    store.write_bytes(
        marker,
        json.dumps({"fingerprint": fp, "attempt": plan.attempt, "metadata_sha256": hashlib.sha256(meta).hexdigest(),
                    "marker": COMMIT_MARKER}).encode("utf-8"),
    )
    return info


__all__ = ["materialize", "load_dataset_info", "FAULT_SLEEP_BEFORE_COMMIT_ENV"]
