"""``tf.data.Dataset`` adapter of the reader (TensorFlow is imported when called, never before).

Besides :func:`make_tf_dataset`, two small process-wide observers:
:func:`batches_served` (how many batches the adapter handed to TensorFlow, per split;
the estimators' tests use it to prove that Keras workers read through this adapter)
and :func:`reader_error` (the original exception raised while a reader was read by a
dataset, which TensorFlow otherwise reports only as an ``OpError`` carrying its text).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from hora.errors import ConfigError
from hora.store.reader import Reader

_LOCK = threading.Lock()
_SERVED: dict[str, int] = {}
_ERRORS: "weakref.WeakKeyDictionary[Reader, BaseException]" = weakref.WeakKeyDictionary()


def batches_served() -> dict[str, int]:
    """Batches every dataset made by :func:`make_tf_dataset` has handed to TensorFlow in this process, per split."""
    with _LOCK:
        return dict(_SERVED)


def reader_error(reader: Reader) -> BaseException | None:
    """The last exception raised while a dataset of :func:`make_tf_dataset` read ``reader`` (None if none)."""
    with _LOCK:
        return _ERRORS.get(reader)


def _signature_of(reader: Reader, columns: Sequence[str], transform: Callable | None) -> dict[str, tuple]:
    """``{column: (per-row shape, numpy dtype)}`` of the batches the dataset yields.

    With ``transform``, it is applied to a one-row all-zeros batch of the reader's
    columns and the signature is read from its result.

    Raises:
        ConfigError: ``transform`` fails on the probe, returns something else than a dict,
            or drops one of ``columns``.
    """
    specs = reader.specs
    if transform is None:
        return {c: (tuple(specs[c].shape), np.dtype(specs[c].dtype)) for c in columns}
    probe = {c: np.zeros((1, *s.shape), dtype=s.dtype) for c, s in specs.items()}
    try:
        out = transform(probe)
    except Exception as exc:
        raise ConfigError(
            f"transformation_fn failed on a one-row all-zeros batch of columns {list(specs)} (used to learn the "
            f"tf.data signature): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, dict):
        raise ConfigError(f"transformation_fn must return a dict of column -> array, got {type(out).__name__}")
    missing = [c for c in columns if c not in out]
    if missing:
        raise ConfigError(f"transformation_fn dropped columns {missing}; it returned {list(out)}")
    sig = {}
    for c in columns:
        arr = np.asarray(out[c])
        if arr.ndim == 0:
            raise ConfigError(f"transformation_fn returned a scalar for column {c!r}; batches need a row dimension")
        sig[c] = (tuple(arr.shape[1:]), arr.dtype)
    return sig


def make_tf_dataset(
    reader: Reader,
    x_cols: Sequence[str] | None = None,
    y_cols: Sequence[str] | None = None,
    sample_weight_col: str | None = None,
    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> Any:
    """A ``tf.data.Dataset`` over the reader's batches, with its cardinality set to ``len(reader)``.

    Without ``x_cols`` each element is the batch dict ``{column: tensor}``. With
    ``x_cols`` (and optionally ``y_cols``, ``sample_weight_col``) elements are
    ``x``, ``(x, y)`` or ``(x, y, w)`` as Keras ``fit`` expects; a single column is a
    tensor, several are a dict; only those columns are read into TensorFlow. Each pass
    over the dataset is one pass of the reader (call ``reader.set_epoch`` between
    epochs for a new shuffle): exactly ``len(reader)`` batches, none dropped or added.
    ``transform`` (``dict of numpy arrays -> dict``, e.g. an estimator's
    ``transformation_fn``) is applied to each numpy batch before TensorFlow sees it.

    An exception raised while reading (a ``StoreError``, a reader timeout, a failing
    ``transform``) reaches the consumer as a TensorFlow ``OpError``; the original is
    kept for :func:`reader_error`.

    Raises:
        ConfigError: not a Reader, columns the reader does not read, or a ``transform``
            that fails on a one-row probe batch or drops a wanted column.
        ImportError: TensorFlow is not installed.
    """
    import tensorflow as tf

    if not isinstance(reader, Reader):
        raise ConfigError(f"make_tf_dataset needs a hora.store Reader, got {type(reader).__name__}")
    if transform is not None and not callable(transform):
        raise ConfigError(f"transform must be callable, got {transform!r}")
    specs = reader.specs
    wanted = [*(x_cols or ()), *(y_cols or ()), *([sample_weight_col] if sample_weight_col else [])]
    if transform is None:
        unknown = [c for c in wanted if c not in specs]
        if unknown:
            raise ConfigError(f"columns {unknown} are not read by this reader; it reads {list(specs)}")
    if y_cols and not x_cols:
        raise ConfigError("y_cols needs x_cols")
    columns = list(dict.fromkeys(wanted)) if x_cols else None
    sig = _signature_of(reader, columns if columns is not None else list(specs), transform)
    signature = {c: tf.TensorSpec(shape=(None, *shape), dtype=tf.as_dtype(dtype)) for c, (shape, dtype) in sig.items()}
    split = reader.split

    def generate():
        try:
            for batch in reader:
                if transform is not None:
                    batch = transform(batch)
                if columns is not None:
                    batch = {c: batch[c] for c in columns}
                with _LOCK:
                    _SERVED[split] = _SERVED.get(split, 0) + 1
                yield batch
        except Exception as exc:
            with _LOCK:
                _ERRORS[reader] = exc
            raise

    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(reader)))
    if not x_cols:
        return ds

    def pick(cols: Sequence[str], batch: dict) -> Any:
        return batch[cols[0]] if len(cols) == 1 else {c: batch[c] for c in cols}

    x_cols, y_list = list(x_cols), list(y_cols or ())

    def to_tuple(batch: dict) -> Any:
        parts = [pick(x_cols, batch)]
        if y_list:
            parts.append(pick(y_list, batch))
        if sample_weight_col:
            parts.append(batch[sample_weight_col])
        return parts[0] if len(parts) == 1 else tuple(parts)

    return ds.map(to_tuple)


__all__ = ["make_tf_dataset", "batches_served", "reader_error"]
