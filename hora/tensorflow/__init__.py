"""The Horovod-style TensorFlow API: ``import hora.tensorflow as hvd``.

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

Process management (``init``, ``rank``, ``size``, ``local_rank``, ``process sets``, the
reduce ops ``Sum``/``Average``/``Min``/``Max``/``Product``, ``Compression``) comes from
:mod:`hora.native`; the collectives here take and return ``tf.Tensor`` (and read
``tf.Variable``/``keras.Variable``), work eagerly and inside ``tf.function``, and carry
Horovod's gradients. TensorFlow itself is imported on first use.
"""

from __future__ import annotations

from hora.native import (
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    ReduceOp,
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
from hora.errors import HorovodInternalError, HostsUpdatedInterrupt
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
from hora.tensorflow.functions import (
    DistributedGradientTape,
    DistributedOptimizer,
    broadcast_,
    broadcast_variables,
)
from hora.tensorflow.mpi_ops import (
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_object,
    grouped_allreduce,
    init,
    join,
    reducescatter,
)

__all__ = [
    "HorovodInternalError", "HostsUpdatedInterrupt", "ccl_built", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
    "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "ReduceOp", "Sum",
    "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall", "barrier",
    "broadcast", "broadcast_", "broadcast_object", "broadcast_variables", "cross_rank", "cross_size",
    "DistributedGradientTape", "DistributedOptimizer", "global_process_set", "grouped_allreduce",
    "init", "is_initialized", "join", "local_rank", "local_size", "rank", "reducescatter",
    "remove_process_set", "shutdown", "size",
]
