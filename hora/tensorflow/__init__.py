"""The Horovod-style TensorFlow API: ``import hora.tensorflow as hvd`` (Horovod's ``horovod.tensorflow``).

::

    import tensorflow as tf
    import hora.tensorflow as hvd

    hvd.init()
    opt = tf.keras.optimizers.Adam(1e-3 * hvd.size())
    for step, (x, y) in enumerate(shard_of_this_rank):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if step == 0:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

Process management (``init``, ``rank``, ``size``, ``local_rank``, process sets, the
reduce ops) comes from :mod:`hora.native`; the collectives take and return ``tf.Tensor``
(and ``tf.IndexedSlices``, variables), work eagerly, inside ``tf.function`` and in
``tf.compat.v1`` graphs, and carry Horovod's gradients. Importing this package does not
import Keras: ``hvd.keras`` (``hora.tensorflow.keras``), ``hvd.elastic`` and
``hvd.SyncBatchNormalization`` are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from hora.errors import HorovodInternalError, HostsUpdatedInterrupt
from hora.native import (
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    ReduceOp,
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
from hora.tensorflow.collectives import (
    Adasum,
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    handle_average_backwards_compatibility,
    reducescatter,
)
from hora.tensorflow.compression import Compression
from hora.tensorflow.functions import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from hora.tensorflow.gradients import DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape
from hora.tensorflow.mpi_ops import (  # noqa: F401 - the underscored ones are Horovod's names too
    _allreduce,
    _grouped_allreduce,
    _grouped_reducescatter,
    _reducescatter,
    add_process_set,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    init,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    remove_process_set,
    size_op,
)
from hora.tensorflow.util import _executing_eagerly, refs_to_vars, vars_to_refs  # noqa: F401


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks (as far as this rank's view tells)."""
    return size() == local_size() * cross_size()


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether ``num_rank`` is a power of two (Horovod's helper for Adasum)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


# names loaded on first use: they import Keras (or hora.torch's elastic state)
_LAZY = {
    "elastic": ("hora.tensorflow.elastic", None),
    "keras": ("hora.tensorflow.keras", None),
    "SyncBatchNormalization": ("hora.tensorflow.sync_batch_norm", "SyncBatchNormalization"),
    "BroadcastGlobalVariablesHook": ("hora.tensorflow.functions", "BroadcastGlobalVariablesHook"),
}


def __getattr__(name: str) -> Any:
    """Import Keras-dependent names on first use (PEP 562).

    Raises:
        AttributeError: ``name`` is not part of :mod:`hora.tensorflow`.
    """
    spec = _LAZY.get(name)
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(spec[0])
    value = module if spec[1] is None else getattr(module, spec[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "PartialDistributedGradientTape", "ProcessSet", "Product", "ReduceOp",
    "Sum", "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast",
    "broadcast_", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "broadcast_variables",
    "ccl_built", "check_num_rank_power_of_2", "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allreduce",
    "grouped_reducescatter", "handle_average_backwards_compatibility", "init", "is_homogeneous", "is_initialized",
    "join", "local_rank", "local_rank_op", "local_size", "local_size_op", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "process_set_included_op", "rank", "rank_op", "reducescatter",
    "refs_to_vars", "remove_process_set", "rocm_built", "shutdown", "size", "size_op", "vars_to_refs",
]
