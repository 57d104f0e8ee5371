"""The public collective API of :mod:`hora.native` (Horovod-style).

Every op accepts a torch tensor or a numpy array and returns the same kind. Ops are
matched across ranks *by name* within their process set, as in Horovod (``name=None``
picks ``"<op>.noname.<n>"``, counted per process set, which matches when every member
calls its unnamed ops in the same order). Synchronous ops are async
ops followed by ``synchronize``; everything runs through the background engine
(:mod:`hora.native.engine`).

Integer ``Average`` is the mean rounded toward zero (Sum, then division by the number
of ranks), like Horovod; integer prescale/postscale factors are applied in float64 and
the result rounded toward zero. ``Adasum`` (floating point only) combines gradients
adaptively (:mod:`hora.native.adasum`). ``root_rank`` of broadcast is a *global* rank that must belong to the process
set. Ranks that called :func:`join` contribute zeros to other ranks' allreduces (and
count in the Average's divisor) until every rank has joined.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hora.errors import ConfigError, DataError
from hora.native import compression as _comp
from hora.native import state as _st
from hora.native.arguments import (
    NUMERIC_DTYPES,
    as_torch,
    check_device,
    op_name,
    process_set_or_none,
    reduce_op,
    resolve_process_set,
    returned,
)
from hora.native.backends.base import ReduceOp
from hora.native.engine import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    JOIN,
    REDUCESCATTER,
    Handle,
    Request,
    fast_allreduce_request,
)
from hora.native.process_sets import ProcessSet, global_process_set
from hora.native.state import _State, _state_or_raise, _submit

Average = ReduceOp.Average
Sum = ReduceOp.Sum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product
Adasum = ReduceOp.Adasum

# ---------------------------------------------------------------------------------------
# allreduce
# ---------------------------------------------------------------------------------------
def _allreduce_request(tensor: Any, op: Any, name: str | None, prescale_factor: float, postscale_factor: float,
                       process_set: ProcessSet | None, compression: Any, inplace: bool) -> tuple[Request, Any]:
    st = _state_or_raise()
    kind = ALLREDUCE
    t, is_np = as_torch(tensor, "allreduce: tensor")
    rop = reduce_op(op, "allreduce")
    if t.dtype not in NUMERIC_DTYPES:
        raise DataError(f"allreduce: dtype {t.dtype} cannot be reduced; use one of float16, bfloat16, float32, "
                        "float64, int32, int64 (or int8/uint8/int16)")
    if rop == ReduceOp.Adasum and not t.is_floating_point():
        raise DataError(f"allreduce: op=Adasum combines floating-point tensors only, got {t.dtype}")
    check_device(t, "allreduce", st)
    ps = resolve_process_set(st, process_set, "allreduce")
    if compression is None:
        comp, comp_name = _comp.NoneCompressor, "none"
    else:
        comp = _comp.resolve(compression)
        comp_name = _comp.name_of(comp)
    src = t if t.is_contiguous() else t.contiguous()
    # out of place: the engine makes the result (in one batched call for a fused group)
    out = src if inplace else None
    req = Request(kind, op_name(st, kind, name, ps), ps.process_set_id, tensor=src, output=out, op=rop,
                  prescale=prescale_factor, postscale=postscale_factor, compressor=comp, comp_name=comp_name)

    if inplace and src is t:
        return req, lambda result: tensor
    if not inplace and not is_np:
        return req, None

    def post(result: torch.Tensor) -> Any:
        if inplace:
            t.copy_(src)
            return tensor
        return returned(result, is_np)

    return req, post


def end_burst() -> None:
    """Tell the engine that a group of submissions is complete (a bucket of gradients):
    it negotiates what it has gathered now rather than waiting for the burst to settle."""
    st = _st._state
    if st is not None:
        st.engine.end_burst()


_ADASUM = ReduceOp.Adasum  # (a module constant: an enum member looked up on its class costs 0.1 us)


def _fast_name(st: _State, name: Any) -> str:
    if name is None:
        return st.auto_name(ALLREDUCE)
    if type(name) is not str or not name:
        raise ConfigError(f"allreduce: name must be a non-empty string, got {name!r}")
    return name


def _allreduce_async(tensor: Any, op: Any, name: str | None, prescale_factor: float, postscale_factor: float,
                     process_set: ProcessSet | None, compression: Any, inplace: bool, blocking: bool) -> Handle:
    """Submit an allreduce (``blocking``: the caller synchronizes on it right away)."""
    st = _st._state
    # the hot path of Horovod-style code and of gradient reduction (a thousand calls a step):
    # a contiguous CPU tensor of a reducible dtype, no autograd, the global set, no
    # compression, not Adasum; the general checks and machinery are skipped
    if (st is not None and type(tensor) is torch.Tensor and (process_set is None or process_set is global_process_set)
            and (compression is None or compression is _comp.NoneCompressor)
            and type(op) is ReduceOp and op is not _ADASUM and tensor.is_cpu and not tensor.requires_grad
            and tensor.is_contiguous()):
        dtype = tensor.dtype
        if dtype in NUMERIC_DTYPES:
            if type(name) is not str or not name:
                name = _fast_name(st, name)
            return st.engine.submit(fast_allreduce_request(name, tensor, tensor if inplace else None, op,
                                                           float(prescale_factor), float(postscale_factor),
                                                           dtype=dtype), blocking)
    req, post = _allreduce_request(tensor, op, name, prescale_factor, postscale_factor, process_set, compression,
                                   inplace=inplace)
    h = _state_or_raise().engine.submit(req, blocking)
    if post is not None:
        h._post = post
    return h


def allreduce_async(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: ProcessSet | None = None,
                    compression: Any = None) -> Handle:
    """Start reducing ``tensor`` across the process set; return a :class:`Handle` whose
    ``synchronize()`` gives a new tensor (or array) with the result."""
    return _allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set, compression, False,
                            False)


def allreduce_async_(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: ProcessSet | None = None,
                     compression: Any = None) -> Handle:
    """In-place :func:`allreduce_async`: the result is written into ``tensor``."""
    return _allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set, compression, True,
                            False)


def room_elements() -> int:
    """Spare elements a :func:`bucket_allreduce_async_` buffer needs after its tensor."""
    return _state_or_raise().engine.room_elements()


def bucket_allreduce_async_(room: torch.Tensor, numel: int, op: Any = Average, name: str | None = None,
                            postscale_factor: float = 1.0) -> Handle:
    """In-place allreduce of ``room[:numel]`` (global process set, CPU, no compression),
    for buffers that keep :func:`room_elements` spare elements after the data: once the
    engine predicts the round, it reduces the tensor in place with the negotiation riding
    in the spare room, one collective and no copy (DistributedOptimizer's flat buckets).
    Every rank must submit the name this way. The spare elements are overwritten.

    Raises:
        ConfigError: ``room`` is not a contiguous 1-D CPU float tensor with ``numel`` +
            :func:`room_elements` elements, or the name is empty.
    """
    st = _state_or_raise()
    need = numel + st.engine.room_elements()
    if (type(room) is not torch.Tensor or room.dim() != 1 or not room.is_contiguous() or not room.is_cpu
            or room.dtype not in (torch.float32, torch.float64) or room.numel() < need or numel < 1):
        raise ConfigError(
            f"bucket_allreduce_async_: room must be a contiguous 1-D CPU float32/float64 tensor of at least "
            f"numel + room_elements() = {need} elements, got "
            f"{tuple(room.shape) if isinstance(room, torch.Tensor) else type(room).__name__}"
            f"{' ' + str(room.dtype) if isinstance(room, torch.Tensor) else ''} for numel={numel}"
        )
    tensor = room[:numel]
    return st.engine.submit(fast_allreduce_request(_fast_name(st, name), tensor, tensor, reduce_op(op, "allreduce"), 1.0,
                                                   float(postscale_factor), room=room))


def allreduce(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet | None = None, compression: Any = None) -> Any:
    """Reduce ``tensor`` across the ranks of ``process_set`` and return the result.

    ``op`` is Average (default), Sum, Min, Max or Product; the input is multiplied by
    ``prescale_factor`` before and the result by ``postscale_factor`` after the reduction.
    ``compression`` (Compression.fp16/bf16) casts floating-point data on the wire.

    Raises:
        NotInitializedError: before init().
        DataError / ConfigError: unsupported input or parameters.
        CollectiveError: ranks disagree on the op (shape, dtype, ...) or it failed.
    """
    return _allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set, compression, False,
                            True).synchronize()


def allreduce_(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: ProcessSet | None = None, compression: Any = None) -> Any:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return _allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set, compression, True,
                            True).synchronize()


class GroupHandle:
    """Handle over several ops; ``synchronize()`` returns the list of results."""

    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles

    def poll(self) -> bool:
        return all(h.poll() for h in self.handles)

    def synchronize(self, timeout: float | None = None) -> list[Any]:
        results, first_error = [], None
        for h in self.handles:
            try:
                results.append(h.synchronize(timeout))
            except Exception as exc:  # wait for all, then raise the first error
                results.append(None)
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def __repr__(self) -> str:
        return f"<hora GroupHandle of {len(self.handles)} {'done' if self.poll() else 'pending'}>"


def _grouped(tensors: Sequence[Any], op: Any, name: str | None, prescale_factor: float, postscale_factor: float,
             process_set: ProcessSet | None, compression: Any, inplace: bool) -> GroupHandle:
    st = _state_or_raise()
    if not isinstance(tensors, (list, tuple)):
        raise DataError(f"grouped_allreduce: expected a list of tensors, got {type(tensors).__name__}")
    base = op_name(st, "grouped_allreduce", name, process_set_or_none(process_set))
    reqs = [_allreduce_request(t, op, f"{base}.{i}", prescale_factor, postscale_factor, process_set,
                               compression, inplace) for i, t in enumerate(tensors)]
    return GroupHandle([_submit(r, p) for r, p in reqs])


def grouped_allreduce_async(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None, compression: Any = None) -> GroupHandle:
    """Start allreducing every tensor of ``tensors`` (they are fused together when ready)."""
    return _grouped(tensors, op, name, prescale_factor, postscale_factor, process_set, compression, False)


def grouped_allreduce_async_(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = None, compression: Any = None) -> GroupHandle:
    """In-place :func:`grouped_allreduce_async`."""
    return _grouped(tensors, op, name, prescale_factor, postscale_factor, process_set, compression, True)


def grouped_allreduce(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None, compression: Any = None) -> list[Any]:
    """Allreduce a list of tensors; returns the list of results."""
    return grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, process_set,
                                   compression).synchronize()


def grouped_allreduce_(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = None, compression: Any = None) -> list[Any]:
    """In-place :func:`grouped_allreduce`; returns the input list."""
    return grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor, process_set,
                                    compression).synchronize()


# ---------------------------------------------------------------------------------------
# allgather, broadcast, alltoall, reducescatter
# ---------------------------------------------------------------------------------------
def _allgather_request(tensor: Any, name: str | None, process_set: ProcessSet | None) -> tuple[Request, Any]:
    st = _state_or_raise()
    t, is_np = as_torch(tensor, "allgather: tensor")
    check_device(t, "allgather", st)
    if t.dim() == 0:
        t = t.reshape(1)
    ps = resolve_process_set(st, process_set, "allgather")
    req = Request(ALLGATHER, op_name(st, ALLGATHER, name, ps), ps.process_set_id, tensor=t.contiguous())
    return req, (lambda r: returned(r, is_np))


def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Handle:
    """Start concatenating every member's ``tensor`` along dim 0 (dim 0 may differ by rank)."""
    return _submit(*_allgather_request(tensor, name, process_set))


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Concatenate every member's ``tensor`` along dim 0, in rank order.

    Raises:
        CollectiveError: ranks disagree on dtype or on the dimensions after the first.
    """
    return allgather_async(tensor, name, process_set).synchronize()


def _broadcast_async(tensor: Any, root_rank: int, name: str | None, process_set: ProcessSet | None,
                     inplace: bool) -> Handle:
    st = _state_or_raise()
    t, is_np = as_torch(tensor, "broadcast: tensor")
    check_device(t, "broadcast", st)
    ps = resolve_process_set(st, process_set, "broadcast")
    ranks = ps.ranks if ps.ranks is not None else list(range(st.size))
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ranks:
        raise ConfigError(f"broadcast: root_rank={root_rank!r} is not a rank of {ps!r} (ranks {ranks})")
    src = t if t.is_contiguous() else t.contiguous()
    out = src if inplace else src.clone()
    req = Request(BROADCAST, op_name(st, BROADCAST, name, ps), ps.process_set_id, tensor=src, output=out,
                  root=int(root_rank))

    def post(result: torch.Tensor) -> Any:
        if inplace:
            if src is not t:
                t.copy_(src)
            return tensor
        return returned(result, is_np)

    return _submit(req, post)


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = None) -> Handle:
    """Start copying ``tensor`` of ``root_rank`` to every member; the result is a new tensor."""
    return _broadcast_async(tensor, root_rank, name, process_set, False)


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Handle:
    """In-place :func:`broadcast_async`."""
    return _broadcast_async(tensor, root_rank, name, process_set, True)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s ``tensor`` on every member (``root_rank`` is a global rank).

    Raises:
        ConfigError: root_rank is not in the process set.
        CollectiveError: ranks disagree on shape, dtype or root.
    """
    return _broadcast_async(tensor, root_rank, name, process_set, False).synchronize()


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return _broadcast_async(tensor, root_rank, name, process_set, True).synchronize()


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet | None = None) -> Handle:
    """Start an alltoall; ``synchronize()`` returns ``(output, received_splits)``."""
    st = _state_or_raise()
    t, is_np = as_torch(tensor, "alltoall: tensor")
    check_device(t, "alltoall", st)
    if t.dim() == 0:
        raise DataError("alltoall: tensor must have at least one dimension")
    ps = resolve_process_set(st, process_set, "alltoall")
    n = len(ps.ranks) if ps.ranks is not None else st.size
    rows = t.shape[0]
    if splits is None:
        if rows % n:
            raise DataError(f"alltoall: dim 0 ({rows}) is not divisible by the {n} ranks; pass splits=")
        split_list = [rows // n] * n
    else:
        if isinstance(splits, (torch.Tensor, np.ndarray)):
            is_int = (not splits.dtype.is_floating_point and not splits.dtype.is_complex and splits.dtype != torch.bool
                      if isinstance(splits, torch.Tensor) else np.issubdtype(splits.dtype, np.integer))
            if not is_int:
                raise ConfigError(f"alltoall: splits must hold integers (int32, as Horovod), got {splits.dtype}")
            splits = splits.tolist()
        if not isinstance(splits, (list, tuple)) or not all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in splits):
            raise ConfigError(f"alltoall: splits must be a sequence of integers, got {splits!r}")
        split_list = [int(s) for s in splits]
        if len(split_list) != n:
            raise ConfigError(f"alltoall: splits has {len(split_list)} entries but the process set has {n} ranks")
        if any(s < 0 for s in split_list) or sum(split_list) != rows:
            raise ConfigError(f"alltoall: splits {split_list} must be >= 0 and sum to dim 0 ({rows})")
    req = Request(ALLTOALL, op_name(st, ALLTOALL, name, ps), ps.process_set_id, tensor=t.contiguous(),
                  splits=tuple(split_list))

    def post(result: tuple[torch.Tensor, torch.Tensor]) -> Any:
        out, recv = result
        return (out.numpy(), recv.numpy()) if is_np else (out, recv)

    return _submit(req, post)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[Any, Any]:
    """Send ``splits[j]`` rows of ``tensor`` to member j; return ``(received, received_splits)``.

    Without ``splits`` dim 0 is divided evenly (it must be divisible).
    """
    return alltoall_async(tensor, splits, name, process_set).synchronize()


def _reducescatter_request(tensor: Any, op: Any, name: str | None, process_set: ProcessSet | None,
                           prescale_factor: float, postscale_factor: float,
                           what: str = "reducescatter") -> tuple[Request, Any]:
    st = _state_or_raise()
    t, is_np = as_torch(tensor, f"{what}: tensor")
    rop = reduce_op(op, what)
    if rop == ReduceOp.Adasum:
        raise NotImplementedError(f"{what}: op=Adasum is not supported (as in Horovod); use Sum or Average")
    if t.dtype not in NUMERIC_DTYPES:
        raise DataError(f"{what}: dtype {t.dtype} cannot be reduced")
    check_device(t, what, st)
    if t.dim() == 0:
        raise DataError(f"{what}: tensor must have at least one dimension (got a scalar)")
    ps = resolve_process_set(st, process_set, what)
    req = Request(REDUCESCATTER, op_name(st, REDUCESCATTER, name, ps), ps.process_set_id, tensor=t.contiguous(), op=rop,
                  prescale=prescale_factor, postscale=postscale_factor)
    return req, (lambda r: returned(r, is_np))


def reducescatter_async(tensor: Any, op: Any = Average, name: str | None = None,
                        process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start a reduce-scatter: reduce ``tensor`` and give member i the i-th block of dim 0
    (blocks as even as possible, the first ranks get one extra row). ``prescale_factor``
    scales every input before the reduction, ``postscale_factor`` the result."""
    return _submit(*_reducescatter_request(tensor, op, name, process_set, prescale_factor, postscale_factor))


def reducescatter(tensor: Any, op: Any = Average, name: str | None = None,
                  process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce ``tensor`` across members and return this member's block of dim 0.

    Raises:
        DataError: a scalar or a dtype that cannot be reduced.
        NotImplementedError: op=Adasum.
        CollectiveError: ranks disagree on shape, dtype or op.
    """
    return reducescatter_async(tensor, op, name, process_set, prescale_factor, postscale_factor).synchronize()


def _group_names(st: _State, kind: str, name: str | None, n: int,
                 process_set: ProcessSet | None = None) -> list[str]:
    base = op_name(st, kind, name, process_set_or_none(process_set))
    return [f"{base}.{i}" for i in range(n)]


def _tensor_list(tensors: Any, what: str) -> list[Any]:
    if not isinstance(tensors, (list, tuple)):
        raise DataError(f"{what}: expected a list of tensors, got {type(tensors).__name__}")
    return list(tensors)


def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None,
                            process_set: ProcessSet | None = None) -> GroupHandle:
    """Start an allgather of every tensor of ``tensors`` (each is gathered along dim 0,
    which may differ by rank); ``synchronize()`` returns the list of results."""
    st = _state_or_raise()
    tensors = _tensor_list(tensors, "grouped_allgather")
    names = _group_names(st, "grouped_allgather", name, len(tensors), process_set)
    reqs = [_allgather_request(t, nm, process_set) for t, nm in zip(tensors, names)]
    return GroupHandle([_submit(r, p) for r, p in reqs])


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[Any]:
    """Allgather a list of tensors; returns the list of gathered tensors."""
    return grouped_allgather_async(tensors, name, process_set).synchronize()


def grouped_reducescatter_async(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                                process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> GroupHandle:
    """Start a reduce-scatter of every tensor of ``tensors`` (all are checked before any
    is submitted); ``synchronize()`` returns the list of this member's blocks."""
    st = _state_or_raise()
    tensors = _tensor_list(tensors, "grouped_reducescatter")
    names = _group_names(st, "grouped_reducescatter", name, len(tensors), process_set)
    reqs = [_reducescatter_request(t, op, nm, process_set, prescale_factor, postscale_factor,
                                   "grouped_reducescatter") for t, nm in zip(tensors, names)]
    return GroupHandle([_submit(r, p) for r, p in reqs])


def grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                          process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """Reduce-scatter a list of tensors; returns the list of this member's blocks."""
    return grouped_reducescatter_async(tensors, op, name, process_set, prescale_factor,
                                       postscale_factor).synchronize()


# ---------------------------------------------------------------------------------------
# barrier, join, handles
# ---------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet | None = None) -> None:
    """Return once every member of ``process_set`` has called barrier."""
    st = _state_or_raise()
    ps = resolve_process_set(st, process_set, "barrier")
    req = Request(BARRIER, st.auto_name(BARRIER, ps.process_set_id), ps.process_set_id)
    _submit(req, None).synchronize()


def join(device: Any = -1) -> int:
    """Declare that this rank has no more data; until every rank has joined, this rank
    contributes zeros to the other ranks' allreduces (any other op submitted by a rank
    while another has joined fails with CollectiveError). Blocks until every rank has
    joined; returns the last rank to join, the same on every rank.

    ``device`` is Horovod's: the GPU on which to make the zeros. hora makes them where
    the other ranks' tensors are, so it only checks the argument.

    Raises:
        ConfigError: ``device`` is not an int, a torch.device or a device string.
    """
    if not isinstance(device, (int, str, torch.device)) or isinstance(device, bool):
        raise ConfigError(f"join(device={device!r}): expected a GPU index (-1 for CPU) or a torch.device")
    st = _state_or_raise()
    req = Request(JOIN, st.auto_name(JOIN), 0)
    return int(_submit(req, None).synchronize())


def handle_average_backwards_compatibility(op: Any, average: Any) -> ReduceOp:
    """Horovod's rule for its deprecated ``average=`` argument: ``op`` wins; mixing both is
    an error; ``average=True/False`` means Average/Sum (with Horovod's DeprecationWarning);
    neither means Average.

    Raises:
        ConfigError: both ``op`` and ``average`` were given (a ValueError, as Horovod's).
    """
    if op is not None:
        if average is not None:
            raise ConfigError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def synchronize(handle: Handle | GroupHandle, timeout: float | None = None) -> Any:
    """Wait for ``handle`` and return its result (raises CollectiveError on failure)."""
    if not isinstance(handle, (Handle, GroupHandle)):
        raise ConfigError(f"synchronize: expected a hora Handle, got {type(handle).__name__}")
    return handle.synchronize(timeout)


def poll(handle: Handle | GroupHandle) -> bool:
    """True when ``handle``'s op has finished."""
    if not isinstance(handle, (Handle, GroupHandle)):
        raise ConfigError(f"poll: expected a hora Handle, got {type(handle).__name__}")
    return handle.poll()
