"""The public collective API of :mod:`hora.native` (Horovod-style), in one namespace.

The API lives in four modules; this one gathers them under the name callers have
always imported (``from hora.native import ops``, ``hora.native.ops.allreduce``):

================  ==============================================================
``state``         init, shutdown, rank/size/local/cross, process-set registration,
                  the timeline, engine_stats
``collectives``   allreduce, allgather, broadcast, alltoall, reducescatter (and
                  their async and grouped forms), barrier, join, handles
``objects``       broadcast_object, allgather_object
``process_sets``  ProcessSet, global_process_set
================  ==============================================================
"""

from __future__ import annotations

from hora.native.collectives import (
    Adasum,
    Average,
    GroupHandle,
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
    bucket_allreduce_async_,
    end_burst,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    handle_average_backwards_compatibility,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    room_elements,
    synchronize,
)
from hora.native.engine import Handle
from hora.native.objects import allgather_object, broadcast_object
from hora.native.process_sets import ProcessSet, global_process_set
from hora.native.state import (
    _state_or_raise,
    add_process_set,
    backend_name,
    cross_rank,
    cross_size,
    engine_stats,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    torch_store,
)

__all__ = [
    "Adasum", "Average", "GroupHandle", "Handle", "Max", "Min", "Product", "ProcessSet", "Sum", "add_process_set",
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "backend_name", "barrier", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "broadcast_object", "bucket_allreduce_async_", "cross_rank", "cross_size",
    "end_burst", "engine_stats", "global_process_set", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "handle_average_backwards_compatibility", "init",
    "is_initialized", "join", "local_rank", "local_size", "poll", "rank", "reducescatter", "reducescatter_async",
    "remove_process_set", "room_elements", "shutdown", "size", "start_timeline", "stop_timeline", "synchronize",
    "torch_store",
]
