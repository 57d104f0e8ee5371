"""Materialize a Spark, Dask or pandas DataFrame to sharded Parquet in a Store, once.

:func:`materialize` keeps only the needed columns, turns Spark ML vectors into
fixed-length float arrays, splits off a validation set, writes
``datasets/<fingerprint>/{train,val}/part-*.parquet`` (plain Parquet, list columns for
arrays, readable by petastorm and Spark) plus ``_metadata.json``, and commits by
writing a marker last. A committed dataset with the same fingerprint is reused.

Concurrent materializations of one dataset (two notebook cells, two jobs of a pipeline)
are safe: each attempt holds a heartbeated lease in the store (:mod:`hora.store.lease`);
a second attempt waits for an older live one to commit and reuses that commit (or, after
``HORA_MATERIALIZE_WAIT_TIMEOUT``, writes its own), commits are exclusive, and no attempt
deletes the files of another live attempt; a crashed writer's leftovers are swept once
its lease expires.

How each engine writes:

* Spark (classic or Connect, :mod:`hora.store.spark_source`): ``mapInArrow`` runs hora's
  Parquet writer inside the tasks (one pass over the data, no sort), through the pickled
  Store (any fsspec URL the executors can reach: checked by a tiny task first).
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
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Sequence

from hora.errors import ConfigError, DataError
from hora.store.commit import assemble, commit, ensure_min_files, load_dataset_info
from hora.store.integrity import check_sizes
from hora.store.dataset import FORMAT_VERSION, DatasetInfo
from hora.store.lease import Lease
from hora.store.sources import DaskSource, PandasSource, Source, check_label_kinds
from hora.store.store import Store
from hora.store.writer import WritePlan

logger = logging.getLogger(__name__)

LABEL_NAN_MODES = ("error", "drop", "keep")
_VECTOR_DTYPES = ("float32", "float64")


# --------------------------------------------------------------------------------------
# public
# --------------------------------------------------------------------------------------

def make_source(df: Any, vector_dtype: str = "float32", compress_sparse: bool = False) -> Source:
    """The :class:`~hora.store.sources.Source` of ``df``'s engine (the engine's module imported only for its
    frames); a Source given as ``df``, with these options.

    Raises:
        DataError: ``df`` is not a Spark, Dask or pandas DataFrame or a Ray Dataset.
    """
    if isinstance(df, Source):
        return df.with_options(vector_dtype, compress_sparse)
    mod = type(df).__module__
    if mod.startswith("pyspark.sql"):
        from pyspark.sql import DataFrame as SparkDF

        if isinstance(df, SparkDF):  # classic and Spark Connect frames alike
            from hora.store.spark_source import SparkSource

            return SparkSource(df, vector_dtype, compress_sparse)
    if mod.startswith("dask") or mod.startswith("dask_expr"):
        import dask.dataframe as dd

        if isinstance(df, dd.DataFrame):
            return DaskSource(df)
    if mod.startswith("ray.data"):
        from hora.store.ray_source import RaySource, is_ray_dataset

        if is_ray_dataset(df):
            return RaySource(df)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(df, pd.DataFrame):
        return PandasSource(df)
    raise DataError(
        f"cannot materialize a {type(df).__module__}.{type(df).__name__}: pass a Spark, Dask or pandas DataFrame "
        "or a Ray Dataset"
    )


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
    compress_sparse_cols: bool = False,
    before_write: Callable[[], None] | None = None,
) -> DatasetInfo:
    """Write the needed columns of ``df`` to ``store`` as train/val Parquet, or reuse a committed copy.

    Args:
        df: a ``pyspark.sql.DataFrame``, a ``dask.dataframe.DataFrame``, a ``pandas.DataFrame``, a Ray
            Dataset, or the :class:`~hora.store.sources.Source` of one (:func:`make_source`).
        store: where to write (``store.layout.dataset_dir(fingerprint)``).
        feature_cols, label_cols, sample_weight_col: the columns to keep. Supported types:
            numeric or boolean scalars, Spark ML vectors (dense or sparse), (nested)
            arrays of numbers with a fixed shape (numpy arrays or lists in pandas/Dask),
            1-d arrays of numbers of any length per row (stored as lists: a ``"ragged"``
            column), binary columns (``bytes``, e.g. PNG images) and strings (features only).
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
        compress_sparse_cols: store Spark ML vector columns as ``indices`` (int32) and
            ``values`` (``vector_dtype``) per row, so the store's size follows the non-zeros
            (a ``"sparse"`` column); default: stored as dense arrays.
        before_write: called once when the data is about to be written (not when a committed
            copy is reused), e.g. to start work that the writing hides; must not raise.

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
    if label_nan not in LABEL_NAN_MODES:
        raise ConfigError(f"label_nan must be one of {LABEL_NAN_MODES}, got {label_nan!r}")
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
    if not isinstance(compress_sparse_cols, bool):
        raise ConfigError(f"compress_sparse_cols must be True or False, got {compress_sparse_cols!r}")
    source = make_source(df, vector_dtype, compress_sparse_cols)
    source.check_schema(stored, label_cols, sample_weight_col, val_col)
    check_label_kinds(getattr(source, "kinds", {}), label_cols)
    sparse_cols = tuple(getattr(source, "sparse_cols", ()))

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
    if sparse_cols:  # (only then: the fingerprints of datasets without sparse columns stay as they were)
        options["compress_sparse_cols"] = True
    token_data = source.data_token(stored + ([val_col] if val_col else []))
    fp = _fingerprint(source.kind, token_data, options)
    logger.debug("materialize: fingerprint %s computed in %.3f s", fp, time.perf_counter() - t0)

    if not overwrite:
        found = load_dataset_info(store, fp)
        if found is not None:
            check_sizes(store, found)  # a missing or truncated file: a DataError here, before any worker starts
            logger.info("materialize: reusing committed dataset %s (%d train / %d val rows)",
                        store.url_for(found.dataset_dir), found.train_rows, found.val_rows)
            return replace(found, reused=True)
    if before_write is not None:
        before_write()

    attempt = uuid.uuid4().hex[:12]
    lease = Lease(store, fp, attempt)
    try:
        if not overwrite:
            found = lease.wait_for_older(lambda: load_dataset_info(store, fp))
            if found is not None:
                logger.info("materialize: reusing dataset %s, committed by a concurrent attempt", fp)
                return replace(found, reused=True)
        lease.set_phase("writing")
        plan = WritePlan(
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
            sparse_cols=sparse_cols,
            vector_dtype=vector_dtype,
        )
        t1 = time.perf_counter()
        try:
            stats = source.write(plan, num_proc, describe=f"hora: materialize {fp} ({len(stored)} columns) to {store.url}")
            info = assemble(fp, store, plan, stats, source.kind, options, val_col is not None or val_frac > 0)
            info = ensure_min_files(store, plan, info, num_proc)
            info = commit(store, plan, info, overwrite, lease)
        except BaseException:
            try:
                store.rm(plan.tmp_dir, recursive=True)
            except Exception as exc:  # pragma: no cover - best effort cleanup
                logger.warning("could not remove %s after a failed materialization: %s", plan.tmp_dir, exc)
            raise
    finally:
        lease.release()
    if info.reused:
        return info
    logger.info(
        "materialize: wrote %s (%d train rows in %d files, %d val rows in %d files) in %.2f s",
        store.url_for(info.dataset_dir), info.train_rows, len(info.train_files),
        info.val_rows, len(info.val_files), time.perf_counter() - t1,
    )
    return info


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


__all__ = ["materialize", "load_dataset_info", "make_source"]
