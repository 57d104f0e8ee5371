"""``hora.spark.common.util``: Horovod's ``util.prepare_data`` (materialize once, train many times).

>>> from hora.spark.common import util
>>> with util.prepare_data(num_proc, store, df, label_columns=["y"], feature_columns=["features"],
...                        validation=0.2) as idx:
...     model = est.fit_on_parquet(dataset_idx=idx)   # no DataFrame: the prepared Parquet

The data is materialized as by a fit (:func:`hora.store.materialize`: committed Parquet under
``datasets/<fingerprint>``, reused when it is already there) and recorded under a dataset
index in the store (:mod:`hora.store.prepared`), so ``fit_on_parquet(dataset_idx=idx)`` (or
``fit_on_parquet()`` for the latest) finds it again, in this program or a later one.

Horovod's other helpers here (``_get_metadata``, ``to_petastorm_fn``, ...) were internals of its
petastorm data path; hora has none (:mod:`hora.horovod_internals`).
"""

from __future__ import annotations

import contextlib
import logging
import numbers
from typing import Any, Iterator, Sequence

from hora.errors import ConfigError, DataError
from hora.horovod_internals import module_getattr

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def prepare_data(num_processes: int, store: Any, df: Any, label_columns: Sequence[str] | None = None,
                 feature_columns: Sequence[str] | None = None, validation: float | str | None = None,
                 sample_weight_col: str | None = None, compress_sparse: bool = False,
                 partitions_per_process: int = 10, verbose: int = 0) -> Iterator[int]:
    """Materialize ``df`` into ``store`` and yield its dataset index (Horovod's ``util.prepare_data``).

    Args:
        num_processes: the ranks that will train on it.
        store: a :class:`hora.store.Store` (``LocalStore(...)``, ``Store.create(...)``).
        df: a Spark (or Dask, pandas) DataFrame.
        label_columns: the label columns (required).
        feature_columns: the feature columns (default: every column but the labels).
        validation: a fraction in [0, 1) or the name of a 0/1 column marking validation rows.
        sample_weight_col: a per-row weight column to keep.
        compress_sparse: store ML vectors as (indices, values) per row.
        partitions_per_process: files per rank of each split (``num_processes * partitions_per_process``).
        verbose: log what was prepared at INFO.

    Yields:
        the dataset index for ``fit_on_parquet(dataset_idx=...)``.

    Raises:
        ConfigError: bad counts, no label columns.
        DataError: a column that does not exist in ``df`` (named), data hora cannot store.
        StoreError: the store cannot be written.
    """
    from hora.store import materialize, prepared
    from hora.store.store import Store

    if not isinstance(store, Store):
        raise ConfigError(f"prepare_data: store must be a hora.store.Store (LocalStore(...), Store.create(...)), got "
                          f"{type(store).__name__}")
    for name, value in (("num_processes", num_processes), ("partitions_per_process", partitions_per_process)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(f"prepare_data: {name} must be an int > 0, got {value!r}")
    if not label_columns:
        raise ConfigError("prepare_data: label_columns cannot be None or empty")
    labels = [label_columns] if isinstance(label_columns, str) else list(label_columns)
    columns = [str(c) for c in df.columns]
    missing = [c for c in labels if c not in columns]
    if missing:
        raise DataError(f"prepare_data: label column(s) {missing} do not exist in the DataFrame; its columns are {columns}")
    if feature_columns is None:
        skip = set(labels) | {sample_weight_col} | ({validation} if isinstance(validation, str) else set())
        features = [c for c in columns if c not in skip]
    else:
        features = [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
        missing = [c for c in features if c not in columns]
        if missing:
            raise DataError(f"prepare_data: feature column(s) {missing} do not exist in the DataFrame; its columns "
                            f"are {columns}")
    info = materialize(df, store, feature_cols=features, label_cols=labels, sample_weight_col=sample_weight_col,
                       validation=validation, num_proc=int(num_processes) * int(partitions_per_process),
                       compress_sparse_cols=bool(compress_sparse))
    idx = prepared.next_index(store)
    prepared.record(store, info, idx)
    (logger.info if verbose else logger.debug)(
        "prepared dataset %d: %s (%d train rows, %d val rows) in %s", idx, info.fingerprint, info.train_rows,
        info.val_rows, store.url_for(store.layout.dataset_dir(info.fingerprint)))
    yield idx


_NO_PETASTORM = ("hora stores plain Parquet and reads it with pyarrow (no petastorm rows, no per-column "
                 "intermediate formats); a prepared dataset's columns are in its _metadata.json "
                 "(hora.store.load_dataset_info)")

__getattr__ = module_getattr(__name__, {
    "_get_metadata": _NO_PETASTORM,
    "to_petastorm_fn": _NO_PETASTORM,
    "_has_vector_column": _NO_PETASTORM,
    "get_simple_meta_from_parquet": _NO_PETASTORM,
    "_wait_file_available_on_dbfs": "hora's datasets are committed with a marker written last, so a reader never "
                                    "waits for files to appear (hora.store.commit)",
    "_get_spark_df_saved_file_list": "hora writes the Parquet files itself and lists them in the dataset's "
                                     "_metadata.json (hora.store.load_dataset_info)",
})

__all__ = ["prepare_data"]
