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

Every name of ``horovod.torch`` is here with Horovod's signature: the collectives
(:mod:`hora.torch.mpi_ops`: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter``, their grouped, ``_async`` and in-place ``_`` variants, differentiable
as Horovod's, ``sparse_allreduce_async``, ``barrier``, ``join``), the life cycle
(``init``, ``shutdown``, ``start_timeline``...), what the install can do
(``nccl_built``, ``gloo_enabled``...), process sets, ``Compression``, the ops ``Average,
Sum, Adasum, Min, Max, Product``, :func:`DistributedOptimizer`,
:func:`broadcast_parameters`, :func:`broadcast_optimizer_state`, :class:`SyncBatchNorm`,
``elastic`` (``TorchState``, ``run``) and Horovod's exception names.
"""

from __future__ import annotations

from hora.errors import HorovodInternalError, HostsUpdatedInterrupt
from hora.native import (
    Compression,
    ProcessSet,
    ReduceOp,
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
    start_timeline,
    stop_timeline,
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
from hora.torch.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
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
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hora.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hora.torch.optimizer import DistributedOptimizer, is_distributed_optimizer
from hora.torch.process_group import destroy_process_group, init_process_group
from hora.torch.sync_batch_norm import SyncBatchNorm
from hora.torch import elastic  # noqa: E402  (hvd.elastic.TorchState, as in Horovod)

__all__ = [
    "HorovodInternalError", "HostsUpdatedInterrupt", "ccl_built", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built",
    "Adasum", "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "ReduceOp", "Sum",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "cross_rank",
    "cross_size", "DistributedOptimizer", "elastic", "global_process_set", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init",
    "init_process_group", "destroy_process_group",
    "is_distributed_optimizer", "is_initialized", "join", "local_rank", "local_size", "poll",
    "rank", "reducescatter", "reducescatter_async", "remove_process_set", "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "SyncBatchNorm", "synchronize",
]
