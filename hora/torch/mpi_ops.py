"""Horovod's torch collectives (``horovod.torch.mpi_ops``), with Horovod's signatures, over
hora's engine (:mod:`hora.native.ops`).

Migrated code keeps working unchanged: the deprecated ``average=`` argument of the
allreduce family (with Horovod's DeprecationWarning; ``op=None`` means Average),
``allreduce(tensor, average, name, compression, op, ...)`` positionally, ``alltoall``
returning just the tensor when no ``splits`` are given, ``join(device)``, sparse
allreduce by allgather of indices and values, and gradients: ``allreduce``,
``allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and their grouped forms are
differentiable (autograd runs the matching collective backward, as Horovod's do).
Errors: ranks that disagree about an op (shape, dtype, root, ...) raise
:class:`~hora.errors.HorovodInternalError` (a RuntimeError) on every rank involved; a
name already in flight, bad splits or other bad arguments raise ValueError subclasses
(:class:`~hora.errors.ConfigError`, :class:`~hora.errors.DataError`); the engine stays
usable after either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hora.errors import ConfigError, DataError
from hora.native import ops as _ops
from hora.native.compression import Compression
from hora.native.engine import Handle
from hora.native.ops import Adasum, Average, GroupHandle, Max, Min, Product, Sum
from hora.native.process_sets import ProcessSet, global_process_set

_resolve_op = _ops.handle_average_backwards_compatibility


def _needs_grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _size_of(process_set: ProcessSet | None) -> int:
    return (process_set or global_process_set).size()


def _rank_in(process_set: ProcessSet | None) -> int:
    return (process_set or global_process_set).rank()


# ------------------------------------------------------------------------------ life cycle
def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Horovod's ``hvd.init(comm=None, process_sets=None)``: :func:`hora.native.init`.

    Raises:
        ConfigError: ``comm`` (a subset of MPI ranks) is not supported by hora; use process sets.
    """
    _ops.init(process_sets, comm=comm)


# ------------------------------------------------------------------------------ allreduce
class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set, compression):  # noqa: D102
        ctx.args = (op, prescale, postscale, process_set, compression)
        return _ops.allreduce(tensor, op=op, name=name, prescale_factor=prescale, postscale_factor=postscale,
                              process_set=process_set, compression=compression)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        op, pre, post, ps, comp = ctx.args
        out = _ops.allreduce(grad.contiguous(), op=op, prescale_factor=pre, postscale_factor=post, process_set=ps,
                             compression=comp)
        return out, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Average (or Sum, Min, Max, Product, Adasum) ``tensor`` over the process set; a new
    tensor (differentiable). ``average`` is deprecated: use ``op``."""
    op = _resolve_op(op, average)
    if _needs_grad(tensor):
        return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, process_set, compression)
    return _ops.allreduce(tensor, op=op, name=name, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, process_set=process_set, compression=compression)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`allreduce`; ``synchronize(handle)`` returns the result."""
    return _ops.allreduce_async(tensor, op=_resolve_op(op, average), name=name, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return _ops.allreduce_(tensor, op=_resolve_op(op, average), name=name, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`allreduce_`."""
    return _ops.allreduce_async_(tensor, op=_resolve_op(op, average), name=name, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, process_set=process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, compression, *tensors):  # noqa: D102
        ctx.args = (op, prescale, postscale, process_set, compression)
        return tuple(_ops.grouped_allreduce(list(tensors), op=op, name=name, prescale_factor=prescale,
                                            postscale_factor=postscale, process_set=process_set,
                                            compression=compression))

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        op, pre, post, ps, comp = ctx.args
        out = _ops.grouped_allreduce([g.contiguous() for g in grads], op=op, prescale_factor=pre,
                                     postscale_factor=post, process_set=ps, compression=comp)
        return (None,) * 6 + tuple(out)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> list:
    """:func:`allreduce` of every tensor of ``tensors``, fused; a list of new tensors (differentiable)."""
    op = _resolve_op(op, average)
    if _needs_grad(*tensors):
        return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, compression,
                                            *tensors))
    return _ops.grouped_allreduce(tensors, op=op, name=name, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, process_set=process_set, compression=compression)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start :func:`grouped_allreduce`."""
    return _ops.grouped_allreduce_async(tensors, op=_resolve_op(op, average), name=name,
                                        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                        process_set=process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list:
    """In-place :func:`grouped_allreduce`; returns the tensors."""
    return _ops.grouped_allreduce_(tensors, op=_resolve_op(op, average), name=name,
                                   prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                   process_set=process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start :func:`grouped_allreduce_`."""
    return _ops.grouped_allreduce_async_(tensors, op=_resolve_op(op, average), name=name,
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                         process_set=process_set)


class SparseHandle:
    """The handle of :func:`sparse_allreduce_async`: call it (or ``synchronize`` it) for
    the reduced sparse tensor, as Horovod's callable handle."""

    def __init__(self, tensor: torch.Tensor, indices: Handle, values: Handle, op: Any,
                 process_set: ProcessSet | None) -> None:
        self._tensor, self._indices, self._values = tensor, indices, values
        self._op, self._ps = op, process_set

    def poll(self) -> bool:
        return self._indices.poll() and self._values.poll()

    def synchronize(self, timeout: float | None = None) -> torch.Tensor:
        values = self._values.synchronize(timeout)
        indices = self._indices.synchronize(timeout)
        if self._op == Average:
            values = values / _size_of(self._ps)
        t = self._tensor
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(), dtype=t.dtype, device=t.device,
                                       check_invariants=False)

    __call__ = synchronize


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: Any,
                           process_set: ProcessSet = global_process_set) -> SparseHandle:
    """Start reducing a sparse COO ``tensor`` by allgathering its indices and values (the
    result holds every rank's entries; Average divides the values by the set's size).

    Raises:
        DataError: ``tensor`` is not sparse.
        ConfigError: ``op`` is not Sum or Average.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise DataError(f"sparse_allreduce_async: expected a sparse COO tensor, got "
                        f"{getattr(tensor, 'layout', type(tensor).__name__)}")
    op = Average if op is None else op
    if op not in (Sum, Average):
        raise ConfigError(f"sparse_allreduce_async: op={op!r}: sparse gradients are reduced with Sum or Average")
    base = name if name is not None else _ops._state_or_raise().auto_name(
        "sparse_allreduce", (process_set.process_set_id or 0) if isinstance(process_set, ProcessSet) else 0)
    indices = _ops.allgather_async(tensor._indices().transpose(0, 1).contiguous(), name=f"{base}.indices",
                                   process_set=process_set)
    values = _ops.allgather_async(tensor._values().contiguous(), name=f"{base}.values", process_set=process_set)
    return SparseHandle(tensor, indices, values, op, process_set)


# ------------------------------------------------------------------------------ allgather, broadcast
def _offset_of(rows: int, process_set: ProcessSet | None) -> int:
    """How many rows the ranks before this one gathered (where this rank's part starts)."""
    dims = _ops.allgather(torch.tensor([rows], dtype=torch.int64), process_set=process_set)
    return int(dims[: _rank_in(process_set)].sum())


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):  # noqa: D102
        ctx.rows, ctx.ps = (tensor.shape[0] if tensor.dim() else 1), process_set
        return _ops.allgather(tensor, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        reduced = _ops.allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        return reduced.narrow(0, _offset_of(ctx.rows, ctx.ps), ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every member's ``tensor`` along dim 0 (which may differ by rank), in rank
    order (differentiable)."""
    if _needs_grad(tensor):
        return _Allgather.apply(tensor, name, process_set)
    return _ops.allgather(tensor, name=name, process_set=process_set)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`allgather`."""
    return _ops.allgather_async(tensor, name=name, process_set=process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):  # noqa: D102
        ctx.rows, ctx.ps = [t.shape[0] if t.dim() else 1 for t in tensors], process_set
        return tuple(_ops.grouped_allgather(list(tensors), name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        reduced = _ops.grouped_allreduce([g.contiguous() for g in grads], op=Average, process_set=ctx.ps)
        dims = _ops.grouped_allgather([torch.tensor([n], dtype=torch.int64) for n in ctx.rows], process_set=ctx.ps)
        r = _rank_in(ctx.ps)
        return (None, None) + tuple(g.narrow(0, int(d[:r].sum()), n) for g, d, n in zip(reduced, dims, ctx.rows))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list:
    """:func:`allgather` of every tensor of ``tensors``; a list (differentiable)."""
    if _needs_grad(*tensors):
        return list(_GroupedAllgather.apply(name, process_set, *tensors))
    return _ops.grouped_allgather(tensors, name=name, process_set=process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start :func:`grouped_allgather`."""
    return _ops.grouped_allgather_async(tensors, name=name, process_set=process_set)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # noqa: D102
        ctx.root, ctx.ps = root_rank, process_set
        return _ops.broadcast(tensor, root_rank, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        reduced = _ops.allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        if _ops.rank() != ctx.root:
            reduced = reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``tensor`` on every member, as a new tensor (differentiable)."""
    if _needs_grad(tensor):
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return _ops.broadcast(tensor, root_rank, name=name, process_set=process_set)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`broadcast`."""
    return _ops.broadcast_async(tensor, root_rank, name=name, process_set=process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return _ops.broadcast_(tensor, root_rank, name=name, process_set=process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start :func:`broadcast_`."""
    return _ops.broadcast_async_(tensor, root_rank, name=name, process_set=process_set)


# ------------------------------------------------------------------------------ alltoall, reducescatter
class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # noqa: D102
        out, received = _ops.alltoall(tensor, splits, name=name, process_set=process_set)
        ctx.received, ctx.ps = received, process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, *unused):  # noqa: D102
        out, _ = _ops.alltoall(grad.contiguous(), ctx.received, process_set=ctx.ps)
        return out, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[j]`` rows of ``tensor`` to member j (equal parts without ``splits``).
    Returns the received tensor, and with ``splits`` also the row counts received from
    each member (an int32 tensor), as Horovod. Differentiable."""
    if _needs_grad(tensor):
        return _Alltoall.apply(tensor, splits, name, process_set)
    out, received = _ops.alltoall(tensor, splits, name=name, process_set=process_set)
    if splits is None:
        return out
    if isinstance(splits, torch.Tensor):
        received = received.to(splits.device)
    return out, received


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall; ``synchronize(handle)`` returns ``(output, received_splits)``."""
    return _ops.alltoall_async(tensor, splits, name=name, process_set=process_set)


def _reducescatter_grad(grad: torch.Tensor, op: Any, pre: float, post: float, ps: ProcessSet | None) -> torch.Tensor:
    if op == Sum:
        grad = grad * _size_of(ps)
    if pre != 1.0:
        grad = grad * pre
    if post != 1.0:
        grad = grad * post
    return grad.contiguous()


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):  # noqa: D102
        ctx.args = (op, prescale, postscale, process_set)
        return _ops.reducescatter(tensor, op=op, name=name, process_set=process_set, prescale_factor=prescale,
                                  postscale_factor=postscale)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        op, pre, post, ps = ctx.args
        return _ops.allgather(_reducescatter_grad(grad, op, pre, post, ps), process_set=ps), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = Compression.none,
                  op: Any = Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce ``tensor`` over the process set and return this member's block of dim 0
    (differentiable). ``compression`` casts floating-point data on the wire."""
    wire, ctx = compression.compress(tensor)
    if _needs_grad(wire):
        out = _Reducescatter.apply(wire, name, op, process_set, prescale_factor, postscale_factor)
    else:
        out = _ops.reducescatter(wire, op=op, name=name, process_set=process_set, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor)
    return compression.decompress(out, ctx)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start :func:`reducescatter`."""
    return _ops.reducescatter_async(tensor, op=op, name=name, process_set=process_set,
                                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):  # noqa: D102
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_ops.grouped_reducescatter(list(tensors), op=op, name=name, process_set=process_set,
                                                prescale_factor=prescale, postscale_factor=postscale))

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        op, pre, post, ps = ctx.args
        out = _ops.grouped_allgather([_reducescatter_grad(g, op, pre, post, ps) for g in grads], process_set=ps)
        return (None,) * 5 + tuple(out)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: Any = Compression.none, op: Any = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list:
    """:func:`reducescatter` of every tensor of ``tensors``; a list (differentiable)."""
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _needs_grad(*wires):
        out = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *wires)
    else:
        out = _ops.grouped_reducescatter(list(wires), op=op, name=name, process_set=process_set,
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    return [compression.decompress(t, c) for t, c in zip(out, ctxs)]


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: Any = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> GroupHandle:
    """Start :func:`grouped_reducescatter`."""
    return _ops.grouped_reducescatter_async(tensors, op=op, name=name, process_set=process_set,
                                            prescale_factor=prescale_factor, postscale_factor=postscale_factor)


# ------------------------------------------------------------------------------ handles, join, barrier
def poll(handle: Any) -> bool:
    """True when the op of ``handle`` has finished (never blocks)."""
    if isinstance(handle, SparseHandle):
        return handle.poll()
    return _ops.poll(handle)


def synchronize(handle: Any) -> Any:
    """Wait for the op of ``handle`` and return its result.

    Raises:
        HorovodInternalError: the op failed (ranks disagree about it, a rank shut down, ...).
    """
    if isinstance(handle, SparseHandle) or (callable(handle) and not isinstance(handle, (Handle, GroupHandle))):
        return handle()
    return _ops.synchronize(handle)


def join(device: Any = -1) -> int:
    """This rank has no more data: it contributes zeros to the others' allreduces until
    every rank has joined. Returns the last rank to join (the same on every rank)."""
    return _ops.join(device)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every member of ``process_set`` has called barrier."""
    _ops.barrier(process_set)


__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "SparseHandle", "allgather", "allgather_async",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init", "join", "poll",
    "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
]
