"""The Horovod-style torch API: ``import hora.torch as hvd``.

::

    import hora.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in shard_of_this_rank:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

The collectives (``allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter``, their ``_async`` and in-place ``_`` variants, ``barrier``, ``join``,
process sets, ``Compression``) come from :mod:`hora.native` and act on torch tensors;
this package adds :func:`DistributedOptimizer`, :func:`broadcast_parameters`,
:func:`broadcast_optimizer_state`, :class:`SyncBatchNorm` and ``elastic.TorchState``.
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
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    cross_rank,
    cross_size,
    global_process_set,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    poll,
    rank,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    shutdown,
    size,
    synchronize,
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
from hora.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hora.torch.optimizer import DistributedOptimizer, is_distributed_optimizer
from hora.torch.sync_batch_norm import SyncBatchNorm
from hora.torch import elastic  # noqa: E402  (hvd.elastic.TorchState, as in Horovod)

__all__ = [
    "HorovodInternalError", "HostsUpdatedInterrupt", "ccl_built", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
    "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "ReduceOp", "Sum",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "cross_rank",
    "cross_size", "DistributedOptimizer", "elastic", "global_process_set", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "init",
    "is_distributed_optimizer", "is_initialized", "join", "local_rank", "local_size", "poll",
    "rank", "reducescatter", "reducescatter_async", "remove_process_set", "shutdown", "size",
    "SyncBatchNorm", "synchronize",
]
