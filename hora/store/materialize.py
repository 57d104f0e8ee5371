"""Materialize a Spark, Dask or pandas DataFrame to sharded Parquet in a Store, once.

See :func:`materialize`.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from hora.store.dataset import DatasetInfo
from hora.store.store import Store

logger = logging.getLogger(__name__)


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
        feature_cols, label_cols, sample_weight_col: the columns to keep.
        validation: None (no validation split), a fraction in [0, 1) drawn by seeded
            random per row, or the name of a boolean / 0-1 column (true = validation row).
        num_proc: training processes; each split gets at least this many files.
        seed: seed of the random validation split.
        label_nan: ``"error"`` (default): NaN or null in a label column raises DataError;
            ``"drop"``: such rows are dropped; ``"keep"``: kept as is.
        vector_dtype: float dtype of Spark ML vectors once stored as arrays.
        rows_per_row_group: Parquet row group size (default: about 8 MiB of data per group).
        overwrite: rewrite even when a committed dataset with the same fingerprint exists.

    Returns:
        the :class:`DatasetInfo` (``info.reused`` tells whether it was found committed).

    Raises:
        DataError: missing columns, unsupported column types, empty frame or split,
            variable-length arrays, a validation column with other values, NaN/null labels.
        ConfigError: bad options (fraction outside [0, 1), num_proc < 1...).
        StoreError: the store cannot be written.
    """
    raise NotImplementedError("hora.store.materialize is being implemented (issue 4)")


def load_dataset_info(store: Store, fingerprint: str) -> DatasetInfo | None:
    """The committed dataset with this fingerprint, or None when there is none (or it is incomplete)."""
    raise NotImplementedError("hora.store.load_dataset_info is being implemented (issue 4)")


__all__ = ["materialize", "load_dataset_info"]
