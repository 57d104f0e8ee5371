"""Batched inference of a fitted model over Spark (``mapInArrow``), Dask (``map_partitions``), Ray Datasets
(``map_batches``) and pandas.

One output column per model output (label). A model output whose per-row shape
is ``()`` or ``(1,)`` becomes a float64 column (Spark ``double``); any other shape
becomes a column of float64 arrays, flattened per row (Spark ``array<double>``).

Each ``feature_cols`` entry is one model input: a column, or a feature group (a list of
scalar columns stacked in order). The framework part, how one batch of inputs is
predicted, is the codec's (:meth:`~hora.estimators.framework.ModelCodec.predict`).

Spark's transform (``mapInArrow``, the model shipped to the executors) is
:mod:`hora.estimators.driver.spark_transform`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from hora.errors import ConfigError, DataError
from hora.estimators.tasks import TEXT_SHAPE
from hora.store.ray_source import RaySource
from hora.store.sources import DaskSource, PandasSource, Source

logger = logging.getLogger(__name__)

#: Rows per forward pass during transform, unless the model says otherwise.
DEFAULT_PREDICT_BATCH = 1024


_cache_lock = threading.Lock()
_model_cache: dict[Any, Any] = {}


def is_text_shape(shape: Sequence[Any]) -> bool:
    """True for :data:`hora.estimators.tasks.TEXT_SHAPE`: a string column (a causal LM's generated text)."""
    return tuple(shape) == TEXT_SHAPE


def _empty_output(shape: Sequence[Any]) -> np.ndarray:
    return np.zeros((0,), dtype=object) if is_text_shape(shape) else np.zeros((0,) + tuple(shape))


def is_scalar_shape(shape: Sequence[int]) -> bool:
    """True for per-row shapes ``()`` and ``(1,)``: predictions are plain doubles."""
    return tuple(shape) in ((), (1,))


def predict_frame(
    codec: Any,
    model: Any,
    pdf: Any,
    feature_cols: Sequence[Any],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int = DEFAULT_PREDICT_BATCH,
    use_gpu: bool = False,
    columns: dict[str, Any] | None = None,
) -> Any:
    """``pdf`` with one prediction column per model output appended (its rows and index as they are);
    with ``use_gpu``, the model runs on this process's GPU (see :func:`_predict`); ``columns``: the
    fit's column settings (:func:`hora.estimators.data.columns.inference_columns`).

    Raises:
        DataError: a feature column is missing, holds strings, or the model returns another
            number of outputs.
        ConfigError: ``use_gpu`` but no CUDA device is visible, or the model's framework has no GPU path.
    """
    from hora.estimators.data.frames import Features

    features = Features.parse(feature_cols)
    missing = [c for c in features.columns if c not in pdf.columns]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the DataFrame to transform; its columns are {list(pdf.columns)}")
    out = pdf.copy()
    if len(pdf) == 0:
        for name, shape in zip(output_cols, output_shapes):
            out[name] = np.zeros((0,), dtype=np.float64) if is_scalar_shape(shape) else \
                np.zeros((0,), dtype=object) if is_text_shape(shape) else []
        return out
    preds = predict_columns(codec, model, {c: pdf[c] for c in features.columns}, features, input_shapes, output_cols,
                            batch_size, use_gpu, columns)
    for name, shape, pred in zip(output_cols, output_shapes, preds):
        if is_text_shape(shape):
            out[name] = np.asarray(pred, dtype=object).reshape(len(pdf))
        else:
            out[name] = pred.reshape(len(pdf)) if is_scalar_shape(shape) else list(pred.reshape(len(pdf), -1))
    return out


def predict_columns(codec: Any, model: Any, values: dict[str, Any], features: Any, input_shapes: Any,
                    output_cols: Sequence[str], batch_size: int = DEFAULT_PREDICT_BATCH, use_gpu: bool = False,
                    columns: dict[str, Any] | None = None) -> list[np.ndarray]:
    """The model's outputs (float64 arrays, one per output column) for one non-empty batch of feature
    ``values`` (a pandas Series or a sequence per column of ``features``): each column read as the
    reader gives it (:func:`hora.estimators.data.frames.column_sample`: bytes, text and variable-length arrays
    too), then the fit's column operations ``columns`` applied
    (:func:`hora.estimators.data.columns.inference_arrays`: decoded, padded with masks, collated).

    Raises:
        DataError: a column holds values hora cannot feed, or the model returns another number of outputs.
        ConfigError: ``use_gpu`` without a GPU path (see :func:`_predict_on`).
    """
    from hora.estimators.data.columns import inference_arrays
    from hora.estimators.data.frames import column_sample

    arrays, specs = {}, {}
    for c in features.columns:
        arrays[c], specs[c] = column_sample(values[c], c)
    arrays = inference_arrays(features, arrays, specs, columns)
    preds = _predict_on(codec, model, features.inputs(arrays), input_shapes, batch_size, use_gpu)
    _check_outputs(preds, output_cols)
    return [p if getattr(p, "dtype", None) == object else np.asarray(p, dtype=np.float64) for p in preds]  # text kept


def _predict_on(codec: Any, model: Any, inputs: Any, input_shapes: Any, batch_size: int, use_gpu: bool) -> Any:
    """``codec.predict``, on the task's GPU when ``use_gpu`` (model moved there, outputs back on the CPU).

    Raises:
        ConfigError: ``use_gpu`` but no CUDA device is visible, or ``codec`` (not PyTorch) has no GPU path.
    """
    name = getattr(codec, "name", type(codec).__name__)
    if name not in _TAKES_CSR:
        inputs = [_densified(a, name) for a in inputs]
    if not use_gpu:
        return codec.predict(model, inputs, input_shapes, batch_size)
    from hora.estimators.devices import inference_device

    if name not in _TAKES_CSR:
        raise ConfigError(f"use_gpu=True for transform is supported for PyTorch models, not {name}")
    return codec.predict(model, inputs, input_shapes, batch_size, device=inference_device())


#: The codecs whose ``predict`` takes a :class:`~hora.store.CsrBatch` input (PyTorch's: as
#: ``torch.sparse_csr`` or densified per forward chunk); the others get dense arrays.
_TAKES_CSR = ("torch", "lightning")


def _densified(arr: Any, codec: str) -> Any:
    """A sparse vector batch as the dense array a non-PyTorch model takes.

    Raises:
        ConfigError: vectors too large to densify a whole batch of (names the size and the limit).
    """
    from hora.store.columns import DENSE_VECTOR_LIMIT, CsrBatch

    if not isinstance(arr, CsrBatch):
        return arr
    if arr.shape[1] > DENSE_VECTOR_LIMIT:
        raise ConfigError(f"a {codec} model takes its inputs dense, and these sparse vectors have {arr.shape[1]} "
                          f"dimensions (more than {DENSE_VECTOR_LIMIT}); transform them with a PyTorch model, or "
                          "reduce their size")
    return arr.toarray()


def check_transform_columns(have: Sequence[Any], features: Sequence[str], output_cols: Sequence[str],
                            what: str = "DataFrame") -> None:
    """The feature columns are in the frame to transform and the output columns are not.

    Raises:
        DataError: names the missing feature columns, or the output columns already there.
    """
    have = {str(c) for c in have}
    missing = [c for c in features if c not in have]
    if missing:
        raise DataError(f"feature column(s) {missing} not in the {what} to transform; its columns are {sorted(have)}")
    clash = [c for c in output_cols if c in have]
    if clash:
        raise DataError(f"output column(s) {clash} already exist in the {what}; set output_cols to other names")


def _check_outputs(preds: Sequence[Any], output_cols: Sequence[str]) -> None:
    if len(preds) != len(output_cols):
        raise DataError(f"the model returned {len(preds)} outputs for {len(output_cols)} output columns {list(output_cols)}")


# ---------------------------------------------------------------------------------------
# the per-process model cache of every engine's tasks
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


# ---------------------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------------------
def dask_transform(
    ddf: Any,
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
    """``ddf`` with prediction columns, computed per partition with ``map_partitions``
    (each partition keeps its rows, their order and its index); with ``use_gpu``, on the worker's GPU.

    Raises:
        DataError: a feature column is missing or an output column already exists.
    """
    import pandas as pd

    from hora.estimators.data.frames import Features
    from hora.store.sources import dask_frame

    names = Features.parse(feature_cols).columns
    ddf = dask_frame(ddf, names)
    check_transform_columns(list(ddf.columns), names, output_cols)
    meta = ddf._meta.copy()
    for name, shape in zip(output_cols, output_shapes):
        meta[name] = pd.Series([], dtype="float64" if is_scalar_shape(shape) else "object")
    key = ("dask-transform", _files_key(model_files))
    feature_cols = list(feature_cols)
    output_cols = list(output_cols)
    output_shapes = [tuple(s) for s in output_shapes]

    def _predict(pdf: Any) -> Any:
        model = _load_cached(key, lambda: codec.deserialize(model_files))
        return predict_frame(codec, model, pdf, feature_cols, input_shapes, output_cols, output_shapes, batch_size,
                             use_gpu=use_gpu, columns=columns)

    return ddf.map_partitions(_predict, meta=meta)


# ---------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------
def ray_transform(
    ds: Any,
    codec: Any,
    model_files: dict[str, bytes],
    feature_cols: Sequence[Any],
    input_shapes: Any,
    output_cols: Sequence[str],
    output_shapes: Sequence[Sequence[int]],
    batch_size: int,
    columns: dict[str, Any] | None = None,
) -> Any:
    """``ds`` with one prediction column per model output, as a lazy Ray Dataset.

    The serialized model is put once in Ray's object store; each Ray worker process
    deserializes it once. Each numpy batch goes through the Spark and Dask transforms' code
    (:func:`hora.estimators.driver.transform.predict_columns`): binary, string and variable-length
    columns as there, and the fit's column operations ``columns``
    (:func:`hora.estimators.data.columns.inference_columns`: ``decode_fn``, ``max_length`` /
    ``truncation`` with the masks, ``collate_fn``). A classifier's ``codec``
    (:class:`~hora.estimators.framework.ClassifierCodec`) gives its rawPrediction, probability and
    prediction columns. Outputs of per-row shape ``()`` or ``(1,)`` are float64 columns, others
    float64 tensor columns of the flattened per-row values.

    Raises:
        DataError: a feature column is missing or an output column already exists
            (checked on the driver, before anything runs).
    """
    from hora.estimators.data.frames import Features
    from hora.estimators.data.ray_dataset import column_names, require_ray

    ray = require_ray("predicting on a Ray Dataset")
    features = Features.parse(feature_cols)
    check_transform_columns(column_names(ds), features.columns, output_cols, "Ray Dataset")
    files_ref = ray.put(model_files)
    key = ("ray-transform", _files_key(model_files))
    output_cols = list(output_cols)
    output_shapes = [tuple(s) for s in output_shapes]

    def _predict(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ray as worker_ray

        n = len(next(iter(batch.values()))) if batch else 0
        out = dict(batch)
        if n:
            model = _load_cached(key, lambda: codec.deserialize(worker_ray.get(files_ref)))
            preds = predict_columns(codec, model, {c: batch[c] for c in features.columns}, features, input_shapes,
                                    output_cols, batch_size, columns=columns)
        else:
            preds = [_empty_output(shape) for shape in output_shapes]
        for name, shape, pred in zip(output_cols, output_shapes, preds):
            if is_text_shape(shape):
                out[name] = np.asarray(pred, dtype=object).reshape(n)
                continue
            pred = np.asarray(pred, dtype=np.float64)
            out[name] = pred.reshape(n) if is_scalar_shape(shape) else pred.reshape(n, -1)
        return out

    return ds.map_batches(_predict, batch_format="numpy", batch_size=None)


# ---------------------------------------------------------------------------------------
# one transform per Source (the scikit-learn face's engines)
# ---------------------------------------------------------------------------------------
@functools.singledispatch
def predict_source(source: Source, codec: Any, model: Any, model_files: Callable[[], dict[str, bytes]],
                   feature_cols: Sequence[Any], input_shapes: Any, output_cols: Sequence[str],
                   output_shapes: Sequence[Sequence[int]], batch_size: int,
                   columns: dict[str, Any] | None = None) -> Any:
    """The frame of ``source`` with the predictions of ``model`` added, by its engine: a pandas frame at
    once (:func:`predict_frame`), a Dask frame per partition (:func:`dask_transform`), a lazy Ray
    Dataset (:func:`ray_transform`). ``model_files`` gives the serialized model for the engines
    that ship it to their workers.

    Raises:
        DataError: a feature column is missing or an output column already exists.
        TypeError: an engine this transform does not serve (Spark frames: ``hora.spark``'s models).
    """
    raise TypeError(f"no transform here for {source.description}")


@predict_source.register(PandasSource)
def _(source: PandasSource, codec, model, model_files, feature_cols, input_shapes, output_cols, output_shapes,
      batch_size, columns=None):
    return predict_frame(codec, model, source.frame, feature_cols, input_shapes, output_cols, output_shapes, batch_size,
                         columns=columns)


@predict_source.register(DaskSource)
def _(source: DaskSource, codec, model, model_files, feature_cols, input_shapes, output_cols, output_shapes,
      batch_size, columns=None):
    return dask_transform(source.frame, codec, model_files(), feature_cols, input_shapes, output_cols, output_shapes,
                          batch_size, columns=columns)


@predict_source.register(RaySource)
def _(source: RaySource, codec, model, model_files, feature_cols, input_shapes, output_cols, output_shapes,
      batch_size, columns=None):
    return ray_transform(source.frame, codec, model_files(), feature_cols, input_shapes, output_cols, output_shapes,
                         batch_size, columns=columns)


__all__ = ["predict_frame", "predict_columns", "dask_transform", "ray_transform", "predict_source",
           "check_transform_columns", "is_scalar_shape", "DEFAULT_PREDICT_BATCH"]
