"""The Horovod-style Keras 3 API (TensorFlow backend): ``import hora.keras as hvd``.

::

    import keras
    import hora.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_shard, y_shard, epochs=5, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=1e-3 * hvd.size(), warmup_epochs=2),
    ], verbose=1 if hvd.rank() == 0 else 0)

``allreduce``/``allgather``/``broadcast`` here take and return numpy values (Horovod's
Keras helpers); the tensor collectives are in :mod:`hora.tensorflow`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import hora.native as hn
from hora.errors import ConfigError
from hora.keras import callbacks
from hora.keras.optimizer import DistributedOptimizer, is_distributed_optimizer, make_distributed_in_place
from hora.native import (
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)
from hora.tensorflow.functions import broadcast_variables
from hora.tensorflow.mpi_ops import allgather_object, broadcast_object, init


def _value(x: Any) -> np.ndarray:
    from hora.tensorflow.mpi_ops import _as_tensor, to_numpy

    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np.asarray(x)
    return to_numpy(_as_tensor(x))


def allreduce(value: Any, name: str | None = None, average: bool = True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = None) -> np.ndarray:
    """Average (or sum) a value (number, numpy array, tensor, variable) across ranks; returns numpy.

    Raises:
        NotInitializedError, CollectiveError: from the backend.
    """
    op = op if op is not None else (hn.Average if average else hn.Sum)
    kwargs: dict[str, Any] = dict(op=op, name=name, prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    if compression is not None:
        kwargs["compression"] = compression
    return np.asarray(hn.allreduce(_value(value), **kwargs))


def allgather(value: Any, name: str | None = None) -> np.ndarray:
    """Concatenate a value from every rank along dimension 0; returns numpy.

    Raises:
        NotInitializedError, CollectiveError: from the backend.
    """
    return np.asarray(hn.allgather(_value(value), name=name))


def broadcast(value: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """``root_rank``'s value on every rank; returns numpy.

    Raises:
        NotInitializedError, CollectiveError: from the backend.
    """
    return np.asarray(hn.broadcast(_value(value), root_rank, name=name))


def broadcast_model(model: Any, root_rank: int = 0) -> None:
    """Assign ``root_rank``'s model variables (and built optimizer's) on every rank.

    Raises:
        ConfigError: ``model`` is not a ``keras.Model``.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ConfigError(f"broadcast_model: expected a keras.Model, got {type(model).__name__}")
    broadcast_variables(model.variables, root_rank)
    opt = getattr(model, "optimizer", None)
    if opt is not None and getattr(opt, "built", False):
        broadcast_variables(opt.variables, root_rank)


def load_model(filepath: str, custom_objects: dict | None = None, compile: bool = True, **distributed: Any) -> Any:
    """Load a ``.keras`` model; its optimizer (with its saved state) becomes distributed.

    ``distributed`` are :func:`DistributedOptimizer` keyword arguments (``compression``,
    ``sparse_as_dense``, ``op``, ...).

    Raises:
        ConfigError: the loaded optimizer is not a Keras 3 optimizer, or a bad argument.
    """
    import keras

    model = keras.models.load_model(filepath, custom_objects=custom_objects, compile=compile)
    opt = getattr(model, "optimizer", None)
    if compile and opt is not None:
        make_distributed_in_place(opt, **distributed)
    return model


__all__ = [
    "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_model", "broadcast_object", "broadcast_variables",
    "callbacks", "cross_rank", "cross_size", "DistributedOptimizer", "global_process_set", "init",
    "is_distributed_optimizer", "is_initialized", "load_model", "local_rank", "local_size", "rank",
    "remove_process_set", "shutdown", "size",
]
