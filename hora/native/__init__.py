"""hora.native: the collective core (Horovod-style API over Gloo, NCCL and MPI).

    import hora.native as hn
    hn.init()
    avg = hn.allreduce(tensor, name="grad.w")          # torch tensor or numpy array
    h = hn.allreduce_async_(tensor, name="grad.b"); hn.synchronize(h)

See :mod:`hora.native.ops` for the ops, :mod:`hora.native.engine` for how ranks agree
on named ops in the background, and :mod:`hora.native.rendezvous` for the environment
contract.
"""

from hora.native.backends.base import ReduceOp
from hora.native.compression import Compression, Compressor
from hora.native.engine import Handle
from hora.native.ops import (
    Average,
    GroupHandle,
    Max,
    Min,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    backend_name,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    cross_rank,
    cross_size,
    engine_stats,
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
from hora.native.process_sets import ProcessSet, global_process_set

__all__ = [
    "ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Compression", "Compressor", "Handle", "GroupHandle",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "backend_name", "engine_stats",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join",
    "broadcast_object", "allgather_object", "synchronize", "poll",
]
