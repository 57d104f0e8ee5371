"""Batched inference of a fitted model on Spark: ``mapInArrow`` over the executors (classic and Connect
sessions, one code path).

The serialized model reaches the executors inside the transform's function when it is small (up to
``HORA_TRANSFORM_INLINE_BYTES``, 16 MiB), else once per session: broadcast on a classic session,
uploaded as a Spark Connect artifact file (``addArtifacts(file=True)``, read on the executors through
``SparkFiles``) on Connect, which has no broadcast. Each task deserializes it once (cached per Python
worker process, so reused Python workers load it once) and predicts Arrow batch by Arrow batch (feature
columns go from Arrow to numpy without pandas, other columns pass through untouched) in chunks of
``batch_size`` rows. Spark ML vector feature columns arrive as Spark's vector struct and are converted in
the task (:func:`hora.store.columns.vector_batch`): dense vectors to arrays, sparse ones to CSR batches
(densified per forward chunk up to 2^16 dimensions). What a batch's prediction is, the output columns and
their types, is :mod:`hora.estimators.driver.transform`'s, shared with the other engines.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import tempfile
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from hora.errors import DataError
from hora.estimators.driver.transform import (
    DEFAULT_PREDICT_BATCH, _check_outputs, _empty_output, _files_key, _load_cached, _predict_on,
    is_scalar_shape, is_text_shape,
)

logger = logging.getLogger(__name__)

#: Model files up to this many bytes travel inside the transform's function; larger ones once per session.
ENV_INLINE_BYTES = "HORA_TRANSFORM_INLINE_BYTES"


def _inline_limit() -> int:
    from hora import settings

    return int(settings.get(ENV_INLINE_BYTES))


_uploaded_lock = threading.Lock()
_uploaded: dict[str, set[str]] = {}  # Connect session id -> artifact files this process uploaded to it


def _upload_artifact(session: Any, name: str, files: dict[str, bytes]) -> None:
    """Upload ``files`` (pickled) to the Connect session as the artifact file ``name``, once per session."""
    from hora import _spark

    sid = _spark.session_key(session)
    with _uploaded_lock:
        if name in _uploaded.setdefault(sid, set()):
            return
        folder = tempfile.mkdtemp(prefix="hora-model-")
        path = os.path.join(folder, name)
        try:
            with open(path, "wb") as fh:
                pickle.dump(files, fh, protocol=pickle.HIGHEST_PROTOCOL)
            session.addArtifacts(path, file=True)
        finally:
            os.unlink(path)
            os.rmdir(folder)
        _uploaded[sid].add(name)


def model_source(session: Any, model_files: dict[str, bytes]) -> Callable[[], dict[str, bytes]]:
    """A picklable function that returns ``model_files`` on an executor, shipped the cheapest way the session has.

    Up to ``HORA_TRANSFORM_INLINE_BYTES`` the files travel inside the function itself
    (any session); larger ones go once per session: a broadcast on a classic session, an
    artifact file on Spark Connect (which has no broadcast).
    """
    from hora import _spark

    size = sum(len(v) for v in model_files.values())
    if size <= _inline_limit():
        return lambda: model_files
    if not _spark.is_connect(session):
        bc = session.sparkContext.broadcast(model_files)
        return lambda: bc.value
    name = f"hora-model-{_files_key(model_files)}.pkl"
    _upload_artifact(session, name, model_files)
    logger.info("uploaded the model (%d bytes) to the Spark Connect session as the artifact file %s", size, name)

    def _from_artifact() -> dict[str, bytes]:
        from pyspark import SparkFiles

        with open(SparkFiles.get(name), "rb") as fh:
            return pickle.load(fh)

    return _from_artifact


def _add_driver_path(entries: Sequence[str]) -> None:
    """Put the driver's ``sys.path`` folders that this process lacks (and that exist here) at the end of its
    own, as the training ranks do (:mod:`hora.runners.rank.main`): a model whose class is defined in a
    module of the driver's (a test file, a script's folder) unpickles on a Spark executor of the same host
    or a shared file system."""
    for entry in entries:
        if entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)


def spark_transform(
    df: Any,
    codec: Any,
    model_files: dict[str, bytes],
    feature_cols: Sequence[Any],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int = DEFAULT_PREDICT_BATCH,
    use_gpu: bool = False,
    columns: dict[str, Any] | None = None,
) -> Any:
    """``df`` with prediction columns, computed on the executors over Arrow batches (``mapInArrow``);
    with ``use_gpu``, on each task's GPU (its Spark GPU address, else cuda:0); ``columns``: the
    fit's column settings (:func:`hora.estimators.data.columns.inference_columns`).

    Feature columns are read from the Arrow batches straight into numpy (no pandas
    conversion; feature groups stacked); every other column, vectors included, passes
    through untouched.

    Raises:
        DataError: a feature column is missing or an output column already exists.
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, DoubleType, StringType, StructField, StructType

    from hora.estimators.data.frames import Features

    features = Features.parse(feature_cols)
    have = set(df.columns)
    missing = [c for c in features.columns if c not in have]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the DataFrame to transform; its columns are {sorted(have)}")
    clash = [c for c in output_cols if c in have]
    if clash:
        raise DataError(f"output column(s) {clash} already exist in the DataFrame; set output_cols to other names")

    # vector features reach the tasks as Spark's vector struct: dense vectors become arrays, sparse ones
    # CSR batches (densified per forward chunk when small), never dense rows of a 2^18-dimension vector
    work = df
    sources: dict[str, str] = {c: c for c in features.columns}
    vectors = {c for c in features.columns if isinstance(df.schema[c].dataType, VectorUDT)}
    out_fields = [
        StructField(name, StringType(), False) if is_text_shape(shape) else
        StructField(name, DoubleType() if is_scalar_shape(shape) else ArrayType(DoubleType(), containsNull=False), False)
        for name, shape in zip(output_cols, output_shapes)
    ]
    schema = StructType(list(df.schema.fields) + out_fields)
    keep = list(df.columns)
    load_files = model_source(df.sparkSession, model_files)
    key = ("spark-transform", _files_key(model_files))
    output_cols = list(output_cols)
    output_shapes = [tuple(s) for s in output_shapes]
    driver_path = tuple(p for p in sys.path if isinstance(p, str) and p)

    def _predict(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from hora.estimators.data.columns import inference_arrays
        from hora.store.columns import arrow_objects, vector_batch

        _add_driver_path(driver_path)  # the model's class may live in a module of the driver's (as for the ranks)
        model = _load_cached(key, lambda: codec.deserialize(load_files()))
        for batch in batches:
            n = batch.num_rows
            out = [batch.column(name) for name in keep]
            if n:
                arrays, specs = {}, {}
                for c, src in sources.items():  # bytes, text, variable-length arrays: decoded / padded below
                    if c in vectors:
                        arrays[c], specs[c] = vector_batch(batch.column(src), c), None
                        continue
                    got = arrow_objects(batch.column(src), c)
                    arrays[c], specs[c] = got if got is not None else (arrow_to_numpy(batch.column(src), c), None)
                arrays = inference_arrays(features, arrays, {c: s for c, s in specs.items() if s is not None},
                                          columns)
                preds = _predict_on(codec, model, features.inputs(arrays), input_shapes, batch_size, use_gpu)
                _check_outputs(preds, output_cols)
            else:
                preds = [_empty_output(shape) for shape in output_shapes]
            for shape, pred in zip(output_shapes, preds):
                if is_text_shape(shape):
                    out.append(pa.array([str(t) for t in np.asarray(pred, dtype=object).reshape(n)], type=pa.string()))
                    continue
                out.append(_arrow_output(np.asarray(pred, dtype=np.float64), n, shape, pa))
            yield pa.RecordBatch.from_arrays(out, names=keep + output_cols)

    return work.mapInArrow(_predict, schema)


def arrow_to_numpy(column: Any, name: str = "feature") -> np.ndarray:
    """An Arrow array of numbers or (nested) fixed-size lists of numbers -> a numpy array ``(rows, *shape)``.

    Raises:
        DataError: nulls, or lists of different lengths (names the column).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        raise DataError(f"feature column {name!r} has {column.null_count} null values")
    n = len(column)
    shape: list[int] = []
    values = column
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        rows = len(values)
        flat = values.flatten()
        if rows and len(flat) % rows:
            raise DataError(f"feature column {name!r} holds arrays of different lengths; hora needs fixed-size arrays")
        width = len(flat) // rows if rows else 0
        lengths = values.value_lengths() if hasattr(values, "value_lengths") else None
        if lengths is not None and rows and (pc.min(lengths).as_py() != width or pc.max(lengths).as_py() != width):
            raise DataError(f"feature column {name!r} holds arrays of different lengths; hora needs fixed-size arrays")
        shape.append(width)
        values = flat
    arr = values.to_numpy(zero_copy_only=False)
    return arr.reshape((n, *shape)) if shape else arr


def _arrow_output(pred: np.ndarray, n: int, shape: Sequence[int], pa: Any) -> Any:
    if is_scalar_shape(shape):
        return pa.array(pred.reshape(n), type=pa.float64())
    flat = pred.reshape(n, -1)
    width = flat.shape[1]
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(flat.reshape(-1), type=pa.float64()))


__all__ = ["spark_transform", "model_source", "arrow_to_numpy"]
