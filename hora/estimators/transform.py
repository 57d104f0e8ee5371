"""Batched inference of a fitted model over Spark (``mapInPandas``), Dask (``map_partitions``) and pandas.

One output column per model output (label). A model output whose per-row shape
is ``()`` or ``(1,)`` becomes a float64 column (Spark ``double``); any other shape
becomes a column of float64 arrays, flattened per row (Spark ``array<double>``).

Spark: the serialized model is broadcast once; each task deserializes it once
(cached per Python worker process, so reused Python workers load it once) and
predicts Arrow batch by Arrow batch in chunks of ``batch_size`` rows. Spark ML
vector feature columns are converted with ``vector_to_array`` into hidden
columns first, so only plain arrays cross into Python.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from hora.errors import DataError

logger = logging.getLogger(__name__)

#: Rows per forward pass during transform, unless the model says otherwise.
DEFAULT_PREDICT_BATCH = 1024

_HIDDEN = "__hora_in_{}"

_cache_lock = threading.Lock()
_model_cache: dict[Any, Any] = {}


def is_scalar_shape(shape: Sequence[int]) -> bool:
    """True for per-row shapes ``()`` and ``(1,)``: predictions are plain doubles."""
    return tuple(shape) in ((), (1,))


def predict_frame(
    trainer: Any,
    model: Any,
    pdf: Any,
    feature_cols: Sequence[str],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int = DEFAULT_PREDICT_BATCH,
    source_cols: Sequence[str] | None = None,
) -> Any:
    """``pdf`` with one prediction column per model output appended.

    Args:
        source_cols: where to read each feature (default: ``feature_cols``).

    Raises:
        DataError: a feature column is missing, or the model returns another number of outputs.
    """
    from hora.estimators.core import series_to_numpy

    source_cols = list(source_cols or feature_cols)
    missing = [c for c in source_cols if c not in pdf.columns]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the DataFrame to transform; its columns are {list(pdf.columns)}")
    out = pdf.copy()
    if len(pdf) == 0:
        for name, shape in zip(output_cols, output_shapes):
            out[name] = np.zeros((0,), dtype=np.float64) if is_scalar_shape(shape) else []
        return out
    inputs = [series_to_numpy(pdf[c]) for c in source_cols]
    for c, arr in zip(source_cols, inputs):
        if arr.dtype.kind in "USO":
            raise DataError(
                f"feature column {c!r} holds {arr.dtype} values; hora needs numbers or fixed-size numeric arrays "
                "(Dask turns object columns into strings unless dask.config 'dataframe.convert-string' is False)"
            )
    preds = trainer.predict(model, inputs, input_shapes, batch_size)
    if len(preds) != len(output_cols):
        raise DataError(f"the model returned {len(preds)} outputs for {len(output_cols)} output columns {list(output_cols)}")
    for name, shape, pred in zip(output_cols, output_shapes, preds):
        pred = np.asarray(pred, dtype=np.float64)
        if is_scalar_shape(shape):
            out[name] = pred.reshape(len(pdf))
        else:
            flat = pred.reshape(len(pdf), -1)
            out[name] = list(flat)
    return out


# ---------------------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------------------
def _files_key(files: dict[str, bytes]) -> str:
    """A content hash of a model's side files (the per-process model cache key)."""
    h = hashlib.sha1()
    for name in sorted(files):
        h.update(name.encode())
        h.update(files[name])
    return h.hexdigest()


def _load_cached(key: Any, loader) -> Any:
    with _cache_lock:
        model = _model_cache.get(key)
        if model is None:
            if len(_model_cache) > 4:  # keep a few models per worker process at most
                _model_cache.clear()
            model = loader()
            _model_cache[key] = model
        return model


def spark_transform(
    df: Any,
    trainer: Any,
    model_files: dict[str, bytes],
    feature_cols: Sequence[str],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int = DEFAULT_PREDICT_BATCH,
) -> Any:
    """``df`` with prediction columns, computed on the executors with ``mapInPandas``.

    Raises:
        DataError: a feature column is missing or an output column already exists.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    have = set(df.columns)
    missing = [c for c in feature_cols if c not in have]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the DataFrame to transform; its columns are {sorted(have)}")
    clash = [c for c in output_cols if c in have]
    if clash:
        raise DataError(f"output column(s) {clash} already exist in the DataFrame; set output_cols to other names")

    # vectors -> hidden array columns; the original columns travel on untouched
    hidden = [_HIDDEN.format(i) for i in range(len(feature_cols))]
    vector_cols = [c for c in df.columns if isinstance(df.schema[c].dataType, VectorUDT)]
    work = df
    for c, h in zip(feature_cols, hidden):
        col = F.col(f"`{c}`")
        work = work.withColumn(h, vector_to_array(col, "float32") if isinstance(df.schema[c].dataType, VectorUDT) else col)
    # other vector columns pass through Python as Arrow structs (dicts in pandas) and are
    # rebuilt as Dense/SparseVectors on the way out, sparsity kept
    out_fields = [
        StructField(name, DoubleType() if is_scalar_shape(shape) else ArrayType(DoubleType(), containsNull=False), False)
        for name, shape in zip(output_cols, output_shapes)
    ]
    schema = StructType(list(work.schema.fields) + out_fields)
    sc = df.sparkSession.sparkContext
    bc = sc.broadcast(model_files)
    key = ("spark", _files_key(model_files))
    feature_cols = list(feature_cols)
    output_cols = list(output_cols)
    output_shapes = [tuple(s) for s in output_shapes]

    def _predict(batches: Iterator[Any]) -> Iterator[Any]:
        model = _load_cached(key, lambda: trainer.deserialize_model(bc.value))
        for pdf in batches:
            out = predict_frame(
                trainer, model, pdf, feature_cols, input_shapes, output_cols, output_shapes, batch_size, source_cols=hidden
            )
            for c in vector_cols:
                out[c] = out[c].map(_as_vector)
            yield out

    result = work.mapInPandas(_predict, schema).drop(*hidden)
    return result.select(*[F.col(f"`{c}`") for c in df.columns], *[F.col(f"`{c}`") for c in output_cols])


def _as_vector(value: Any) -> Any:
    """A Spark ML vector from its Arrow struct form (``{"type", "size", "indices", "values"}``)."""
    if value is None or hasattr(value, "toArray"):
        return value
    from pyspark.ml.linalg import DenseVector, SparseVector

    if int(value["type"]) == 0:
        return SparseVector(int(value["size"]), list(value["indices"]), list(value["values"]))
    return DenseVector(value["values"])


# ---------------------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------------------
def dask_transform(
    ddf: Any,
    trainer: Any,
    model_files: dict[str, bytes],
    feature_cols: Sequence[str],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int = DEFAULT_PREDICT_BATCH,
) -> Any:
    """``ddf`` with prediction columns, computed per partition with ``map_partitions``.

    Raises:
        DataError: a feature column is missing or an output column already exists.
    """
    import pandas as pd

    have = set(str(c) for c in ddf.columns)
    missing = [c for c in feature_cols if c not in have]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the DataFrame to transform; its columns are {sorted(have)}")
    clash = [c for c in output_cols if c in have]
    if clash:
        raise DataError(f"output column(s) {clash} already exist in the DataFrame; set output_cols to other names")
    meta = ddf._meta.copy()
    for name, shape in zip(output_cols, output_shapes):
        meta[name] = pd.Series([], dtype="float64" if is_scalar_shape(shape) else "object")
    key = ("dask", _files_key(model_files))
    feature_cols = list(feature_cols)
    output_cols = list(output_cols)
    output_shapes = [tuple(s) for s in output_shapes]

    def _predict(pdf: Any) -> Any:
        model = _load_cached(key, lambda: trainer.deserialize_model(model_files))
        return predict_frame(trainer, model, pdf, feature_cols, input_shapes, output_cols, output_shapes, batch_size)

    return ddf.map_partitions(_predict, meta=meta)


__all__ = ["predict_frame", "spark_transform", "dask_transform", "is_scalar_shape", "DEFAULT_PREDICT_BATCH"]
