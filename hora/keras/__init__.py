"""The Horovod-style Keras 3 API (TensorFlow backend): ``import hora.keras as hvd``.

The same module is ``hora.tensorflow.keras`` (Horovod's ``horovod.tensorflow.keras``;
both names give these objects)::

    import keras
    import hora.tensorflow.keras as hvd      # or: import hora.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_shard, y_shard, epochs=5, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=1e-3 * hvd.size(), warmup_epochs=2),
    ], verbose=1 if hvd.rank() == 0 else 0)

``allreduce``/``allgather``/``broadcast``/``reducescatter`` take tensor-compatible
values (numbers, numpy arrays, tensors, variables) and return tensors, as Horovod's
Keras helpers do in TensorFlow 2; ``hvd.elastic`` holds the elastic state and callbacks.
"""

from __future__ import annotations

from typing import Any

from hora.errors import ConfigError
from hora.keras import callbacks
from hora.keras.optimizer import DistributedOptimizer, is_distributed_optimizer, make_distributed_in_place
from hora.native import (
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    cross_rank,
    cross_size,
    global_process_set,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hora.native.build_info import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hora.tensorflow import collectives as _collectives
from hora.tensorflow import mpi_ops as _mpi_ops
from hora.tensorflow.compression import Compression
from hora.tensorflow.functions import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)
from hora.tensorflow.mpi_ops import add_process_set, init, remove_process_set


def _constant(value: Any, name: str | None):
    import tensorflow as tf

    from hora.tensorflow.bridge import as_tensor, is_keras_variable

    if isinstance(value, (tf.Tensor, tf.Variable)) or is_keras_variable(value):
        return as_tensor(value)
    return tf.constant(value, name=name)


def allreduce(value: Any, name: str | None = None, average: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = None):
    """Reduce a tensor-compatible value across ranks (``op``: Average by default); returns a tensor.

    ``average`` is Horovod's deprecated spelling of ``op=Average``/``Sum`` (it warns).

    Raises:
        NotInitializedError, DataError, CollectiveError: from :func:`hora.tensorflow.allreduce`.
    """
    return _collectives.allreduce(_constant(value, name), average=average, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, op=op, compression=compression, name=name)


def allgather(value: Any, name: str | None = None):
    """Concatenate a tensor-compatible value from every rank along dimension 0; returns a tensor.

    Raises:
        NotInitializedError, DataError, CollectiveError: from :func:`hora.tensorflow.allgather`.
    """
    return _mpi_ops.allgather(_constant(value, name), name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None):
    """``root_rank``'s tensor-compatible value on every rank; returns a tensor.

    Raises:
        NotInitializedError, DataError, CollectiveError: from :func:`hora.tensorflow.broadcast`.
    """
    return _mpi_ops.broadcast(_constant(value, name), root_rank, name=name)


def reducescatter(value: Any, name: str | None = None, op: Any = Average):
    """Reduce a tensor-compatible value across ranks; this rank's block of dimension 0 (a tensor).

    Raises:
        NotInitializedError, DataError, CollectiveError: from :func:`hora.tensorflow.reducescatter`.
    """
    return _collectives.reducescatter(_constant(value, name), op=op, name=name)


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


def load_model(filepath: str, custom_optimizers: list | None = None, custom_objects: dict | None = None,
               compression: Any = None, legacy_opts: bool = False, *, compile: bool = True,
               **distributed: Any) -> Any:
    """Load a saved Keras model; its optimizer (with its saved state) becomes distributed.

    Horovod's signature: ``custom_optimizers`` are optimizer classes of your own the
    file uses (plain Keras optimizers need nothing), ``custom_objects`` as in
    ``keras.models.load_model``, ``compression`` for the gradient allreduce.
    ``distributed`` are further :func:`DistributedOptimizer` keyword arguments
    (``sparse_as_dense``, ``op``, ...).

    Raises:
        ConfigError: ``legacy_opts=True`` (Keras 2 optimizers do not exist in Keras 3), the
            loaded optimizer is not a Keras 3 optimizer, or a bad argument.
    """
    import keras

    if legacy_opts:
        raise ConfigError("load_model(legacy_opts=True): keras.optimizers.legacy does not exist in Keras 3; "
                          "save the model with a Keras 3 optimizer")
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None, compile=compile)
    opt = getattr(model, "optimizer", None)
    if compile and opt is not None:
        if compression is not None:
            distributed["compression"] = compression
        make_distributed_in_place(opt, **distributed)
    return model


def __getattr__(name: str) -> Any:
    """``hvd.elastic`` is imported on first use.

    Raises:
        AttributeError: any other unknown name.
    """
    if name == "elastic":
        import importlib

        module = importlib.import_module("hora.keras.elastic")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_global_variables", "broadcast_model",
    "broadcast_object", "broadcast_variables", "callbacks", "ccl_built", "cross_rank", "cross_size", "cuda_built",
    "ddl_built", "DistributedOptimizer", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "init",
    "is_distributed_optimizer", "is_initialized", "load_model", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "reducescatter", "remove_process_set", "rank",
    "rocm_built", "shutdown", "size",
]
