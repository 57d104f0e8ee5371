"""hora.native: the collective core (Horovod-style API over Gloo, NCCL and MPI).

    import hora.native as hn
    hn.init()
    avg = hn.allreduce(tensor, name="grad.w")          # torch tensor or numpy array
    h = hn.allreduce_async_(tensor, name="grad.b"); hn.synchronize(h)

See :mod:`hora.native.ops` for the ops, :mod:`hora.native.engine` for how ranks agree
on named ops in the background, and :mod:`hora.native.rendezvous` for the environment
contract.

The package is lazy (PEP 562): importing it, or :mod:`hora.native.rendezvous` (which
launchers, Spark/Dask task supervisors and drivers need), does not import torch. The
op layer is imported the first time one of its names is used (``hn.allreduce``,
``from hora.native import allreduce``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "ReduceOp": "hora.native.backends.base",
    "Compression": "hora.native.compression",
    "Compressor": "hora.native.compression",
    "Handle": "hora.native.engine",
    "ProcessSet": "hora.native.process_sets",
    "global_process_set": "hora.native.process_sets",
}
for _name in (
    "Adasum", "Average", "GroupHandle", "Max", "Min", "Product", "Sum", "add_process_set", "allgather",
    "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "backend_name", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "cross_rank", "cross_size", "engine_stats", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "handle_average_backwards_compatibility", "init", "is_initialized", "join", "local_rank", "local_size", "poll",
    "rank", "reducescatter", "reducescatter_async", "remove_process_set", "shutdown", "size", "start_timeline",
    "stop_timeline", "synchronize",
):
    _EXPORTS[_name] = "hora.native.ops"
for _name in (
    "gloo_built", "nccl_built", "mpi_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built",
    "gloo_enabled", "mpi_enabled", "mpi_threads_supported",
):
    _EXPORTS[_name] = "hora.native.build_info"
del _name

# submodules reachable as attributes (``hn.engine``) even before anything imported them
_SUBMODULES = ("adasum", "backends", "build_info", "collectives", "compression", "elastic", "engine", "keys",
               "objects", "ops", "process_sets", "rendezvous", "state", "timeline")

__all__ = [
    "ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "Compressor", "Handle", "GroupHandle",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "backend_name", "engine_stats",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join",
    "broadcast_object", "allgather_object", "synchronize", "poll", "start_timeline", "stop_timeline",
    "handle_average_backwards_compatibility",
    "gloo_built", "nccl_built", "mpi_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built",
    "gloo_enabled", "mpi_enabled", "mpi_threads_supported",
]


def __getattr__(name: str) -> Any:
    """Import the defining submodule on first use of a public name (PEP 562).

    Raises:
        AttributeError: ``name`` is not part of :mod:`hora.native`.
    """
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    dunders = {n for n in globals() if n.startswith("__") and n.endswith("__")}
    return sorted(dunders | set(__all__) | set(_SUBMODULES))


if TYPE_CHECKING:  # what static tools see; at run time __getattr__ provides these
    from hora.native.backends.base import ReduceOp
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
    from hora.native.compression import Compression, Compressor
    from hora.native.engine import Handle
    from hora.native.ops import (
        Adasum,
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
        grouped_allgather,
        grouped_allgather_async,
        grouped_allreduce,
        grouped_allreduce_,
        grouped_allreduce_async,
        grouped_allreduce_async_,
        grouped_reducescatter,
        grouped_reducescatter_async,
        handle_average_backwards_compatibility,
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
        start_timeline,
        stop_timeline,
        synchronize,
    )
    from hora.native.process_sets import ProcessSet, global_process_set
