"""``hora.spark.common.util``: Horovod's ``util.prepare_data`` (materialize once, train many times).

>>> from hora.spark.common import util
>>> with util.prepare_data(num_proc, store, df, label_columns=["y"], feature_columns=["features"],
...                        validation=0.2) as idx:
...     model = est.fit_on_parquet(dataset_idx=idx)   # no DataFrame: the prepared Parquet

The data is materialized as by a fit (:func:`hora.store.materialize`: committed Parquet under
``datasets/<fingerprint>``, reused when it is already there) and recorded under a dataset
index in the store (:mod:`hora.store.prepared`), so ``fit_on_parquet(dataset_idx=idx)`` (or
``fit_on_parquet()`` for the latest) finds it again, in this program or a later one.

``_get_metadata(df)`` gives Horovod's per-column metadata, which a model built by hand takes as
``_metadata=``. Horovod's other helpers here (``to_petastorm_fn``, ...) were internals of its
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


def _get_metadata(df: Any) -> dict[str, dict[str, Any]]:
    """Horovod's per-column metadata of a Spark DataFrame, for ``TorchModel(..., _metadata=...)`` /
    ``KerasModel`` built by hand: ``{col: {"spark_data_type", "is_sparse_vector_only", "shape",
    "intermediate_format", "max_size"}}``, from one pass over the rows (ML vectors: their size and
    most non-zeros; arrays: their longest length; scalars: 1). A model built by hand keeps it
    (``model._get_metadata()``); hora's own reader does not need it.

    Raises:
        DataError: ``df`` is not a Spark DataFrame.
    """
    from pyspark.ml.linalg import DenseVector, SparseVector
    from pyspark.sql import DataFrame

    from hora.spark.common import constants

    if not isinstance(df, DataFrame):
        raise DataError(f"_get_metadata takes a Spark DataFrame, got {type(df).__module__}.{type(df).__name__}")
    names = list(df.columns)

    def info(row: Any) -> list[tuple[frozenset, int, int]]:
        out = []
        for value in row:
            if isinstance(value, SparseVector):
                out.append((frozenset({"sparse"}), int(value.size), len(value.indices)))
            elif isinstance(value, DenseVector):
                out.append((frozenset({"dense"}), int(value.size), int(value.size)))
            elif isinstance(value, (list, tuple)):
                out.append((frozenset({"array"}), len(value), len(value)))
            else:
                out.append((frozenset({"scalar"}), 1, 1))
        return out

    def merge(a: list, b: list) -> list:
        return [(ka | kb, max(sa, sb), max(ma, mb)) for (ka, sa, ma), (kb, sb, mb) in zip(a, b)]

    empty = [(frozenset(), 0, 0)] * len(names)
    seen = df.rdd.map(info).fold(empty, merge)
    metadata = {}
    for field, (kinds, shape, max_size) in zip(df.schema.fields, seen):
        if "dense" in kinds:
            kind, sparse_only, fmt = DenseVector, False, constants.ARRAY
        elif "sparse" in kinds:
            kind, sparse_only, fmt = SparseVector, True, constants.CUSTOM_SPARSE
        else:
            kind, sparse_only, fmt = type(field.dataType), False, constants.NOCHANGE
        metadata[field.name] = {"spark_data_type": kind, "is_sparse_vector_only": sparse_only, "shape": shape,
                                "intermediate_format": fmt, "max_size": max_size}
    return metadata


_NO_PETASTORM = ("hora stores plain Parquet and reads it with pyarrow (no petastorm rows, no per-column "
                 "intermediate formats); a prepared dataset's columns are in its _metadata.json "
                 "(hora.store.load_dataset_info)")

__getattr__ = module_getattr(__name__, {
    "to_petastorm_fn": _NO_PETASTORM,
    "_has_vector_column": _NO_PETASTORM,
    "get_simple_meta_from_parquet": _NO_PETASTORM,
    "_wait_file_available_on_dbfs": "hora's datasets are committed with a marker written last, so a reader never "
                                    "waits for files to appear (hora.store.commit)",
    "_get_spark_df_saved_file_list": "hora writes the Parquet files itself and lists them in the dataset's "
                                     "_metadata.json (hora.store.load_dataset_info)",
})

__all__ = ["prepare_data"]
