"""The public collective API of :mod:`hora.native` (Horovod-style).

Every op accepts a torch tensor or a numpy array and returns the same kind. Ops are
matched across ranks *by name* (``name=None`` picks ``"<op>.noname.<n>"``, which matches
when every rank calls its unnamed ops in the same order). Synchronous ops are async
ops followed by ``synchronize``; everything runs through the background engine
(:mod:`hora.native.engine`).

Integer ``Average`` is the floor of the mean (Sum, then floor division by the number
of ranks), like Horovod; integer prescale/postscale factors are applied in float64 and
floored. ``root_rank`` of broadcast is a *global* rank that must belong to the process
set. Ranks that called :func:`join` contribute zeros to other ranks' allreduces (and
count in the Average's divisor) until every rank has joined.
"""

from __future__ import annotations

import atexit
import logging
import pickle
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hora.errors import ConfigError, DataError, NotInitializedError
from hora.native import compression as _comp
from hora.native.backends.base import Backend, ReduceOp
from hora.native.engine import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    JOIN,
    PS_ADD,
    PS_REMOVE,
    REDUCESCATTER,
    Engine,
    EngineConfig,
    Handle,
    Request,
    fast_allreduce_request,
)
from hora.native.process_sets import ProcessSet, global_process_set
from hora.native.timeline import Timeline

log = logging.getLogger(__name__)

Average = ReduceOp.Average
Sum = ReduceOp.Sum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

_NUMERIC = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
            torch.int8, torch.uint8, torch.int16}


class _State:
    def __init__(self, backend: Backend, engine: Engine, local_rank: int, local_size: int, cross_rank: int,
                 cross_size: int, extras: list[Any]) -> None:
        self.backend = backend
        self.engine = engine
        self.rank = backend.rank
        self.size = backend.size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self.extras = extras  # objects to close at shutdown (stores, clients)
        self.counters: dict[str, int] = {}
        self.next_ps_id = 1
        self.lock = threading.Lock()

    def auto_name(self, kind: str) -> str:
        with self.lock:
            n = self.counters.get(kind, 0)
            self.counters[kind] = n + 1
        return f"{kind}.noname.{n}"


_state: _State | None = None
_init_lock = threading.Lock()
_atexit_registered = False


def _state_or_raise() -> _State:
    st = _state
    if st is None:
        raise NotInitializedError("hora has not been initialized; call hora.init()")
    return st


# ---------------------------------------------------------------------------------------
# life cycle
# ---------------------------------------------------------------------------------------
def init(process_sets: Sequence[ProcessSet | Sequence[int]] | None = None) -> None:
    """Join the job described by the ``HORA_*`` environment and start the engine.

    The backend is ``HORA_BACKEND`` (auto, gloo, nccl, mpi). ``auto`` picks MPI when the
    process was started by ``mpiexec`` (PMI_RANK, OMPI_COMM_WORLD_RANK or PMIX_RANK set)
    and no hora rendezvous address is given, else Gloo (plus NCCL for CUDA tensors when a
    GPU is present). Without any launcher variables the job has one rank and needs no
    network. ``process_sets`` are registered (collectively) after start-up. Calling init
    twice is a no-op.

    Raises:
        ConfigError: unknown backend or malformed environment.
        RendezvousError: peers never arrived within ``HORA_START_TIMEOUT``.
    """
    global _state, _atexit_registered
    with _init_lock:
        if _state is not None:
            return
        from hora.native.backends import create_backend, requested_backend
        from hora.native.backends.nccl import nccl_available

        if requested_backend() == "nccl" and not nccl_available():
            raise ConfigError("HORA_BACKEND=nccl, but this torch build has no NCCL or no GPU is visible; "
                              "use HORA_BACKEND=gloo (or auto)")
        backend, placement, extras = create_backend()
        config = EngineConfig()
        timeline = Timeline.from_environ(backend.rank)
        engine = Engine(backend, config, timeline, _device_factories(backend, placement[0]))
        _state = _State(backend, engine, *placement, extras=extras)
        if not _atexit_registered:
            atexit.register(shutdown)  # drain and stop the engine even if the script forgets
            _atexit_registered = True
        log.info("hora initialized: rank %d of %d on %s (fusion %d B, cycle %.2f ms, cache %d)",
                 backend.rank, backend.size, backend.name, config.fusion_threshold, config.cycle_time * 1e3,
                 config.cache_capacity)
    for ps in process_sets or ():
        add_process_set(ps)


def _device_factories(backend: Backend, local_rank: int) -> dict[str, Any]:
    """NCCL for CUDA tensors when requested (HORA_BACKEND=nccl) or available (auto).

    Raises:
        ConfigError: HORA_BACKEND=nccl where NCCL or a GPU is missing.
    """
    from hora.native.backends import collective_timeout, requested_backend
    from hora.native.backends.nccl import NcclBackend, nccl_available

    wanted = requested_backend()
    if wanted == "nccl" and not nccl_available():
        raise ConfigError("HORA_BACKEND=nccl, but this torch build has no NCCL or no GPU is visible; "
                          "use HORA_BACKEND=gloo (or auto)")
    store = getattr(backend, "_store", None)
    if wanted in ("auto", "nccl") and nccl_available() and store is not None:
        timeout = collective_timeout()
        return {"cuda": lambda: NcclBackend(backend.rank, backend.size, store=store, local_rank=local_rank,
                                            timeout=timeout)}
    return {}


def shutdown() -> None:
    """Stop the engine and release the backend (idempotent)."""
    global _state
    with _init_lock:
        st, _state = _state, None
    if st is None:
        return
    try:
        st.engine.shutdown()
    finally:
        try:
            st.backend.shutdown()
        finally:
            for obj in st.extras:
                close = getattr(obj, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:  # best effort
                        pass
            global_process_set.ranks = None


def is_initialized() -> bool:
    """Whether :func:`init` has run (and :func:`shutdown` has not)."""
    return _state is not None


def rank() -> int:
    """This process's global rank. Raises NotInitializedError before init()."""
    return _state_or_raise().rank


def size() -> int:
    """The number of ranks in the job. Raises NotInitializedError before init()."""
    return _state_or_raise().size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _state_or_raise().local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return _state_or_raise().local_size


def cross_rank() -> int:
    """The index of this host among the hosts that have a rank with this local rank."""
    return _state_or_raise().cross_rank


def cross_size() -> int:
    """The number of hosts that have a rank with this local rank."""
    return _state_or_raise().cross_size


def backend_name() -> str:
    """Name of the CPU backend in use ("gloo" or "mpi")."""
    return _state_or_raise().backend.name


def engine_stats() -> dict[str, int]:
    """Counters of the engine: rounds, cache_hits, cache_misses, fused_batches, ..."""
    return _state_or_raise().engine.engine_stats()


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def _as_torch(x: Any, what: str) -> tuple[torch.Tensor, bool]:
    if isinstance(x, torch.Tensor):
        return x, False
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise DataError(f"{what}: numpy arrays of dtype object cannot be communicated")
        if not x.flags.writeable:
            x = x.copy()
        try:
            return torch.from_numpy(x), True
        except TypeError as exc:
            raise DataError(f"{what}: numpy dtype {x.dtype} is not supported: {exc}") from None
    raise DataError(f"{what} must be a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")


def _resolve_ps(st: _State, process_set: ProcessSet | None, what: str) -> ProcessSet:
    if process_set is None or process_set is global_process_set:
        return global_process_set
    ps = process_set
    if not isinstance(ps, ProcessSet):
        raise ConfigError(f"{what}: process_set must be a hora ProcessSet, got {type(ps).__name__}")
    if ps.process_set_id is None:
        raise ConfigError(f"{what}: {ps!r} is not registered; call hora.add_process_set() on every rank first")
    ranks = ps.ranks if ps.ranks is not None else list(range(st.size))
    if st.rank not in ranks:
        raise ConfigError(f"{what}: rank {st.rank} is not a member of {ps!r}")
    return ps


def _op(op: Any, what: str) -> ReduceOp:
    if type(op) is ReduceOp:
        return op
    try:
        return ReduceOp(op)
    except (ValueError, TypeError):
        raise ConfigError(f"{what}: op={op!r} is not one of hora.Sum, Average, Min, Max, Product") from None


def _check_tensor(t: torch.Tensor, what: str, st: _State) -> None:
    if not t.is_cpu:
        if t.device.type == "cuda" and not st.engine.supports_device("cuda"):
            raise ConfigError(f"{what}: CUDA tensors need the NCCL backend, which is not available here")
        if t.device.type not in ("cuda",):
            raise DataError(f"{what}: tensors on device {t.device} are not supported")


def _name(st: _State, kind: str, name: str | None) -> str:
    if name is None:
        return st.auto_name(kind)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind}: name must be a non-empty string, got {name!r}")
    return name


def _ret(t: torch.Tensor, as_numpy: bool) -> Any:
    return t.numpy() if as_numpy else t


# ---------------------------------------------------------------------------------------
# allreduce
# ---------------------------------------------------------------------------------------
def _allreduce_request(tensor: Any, op: Any, name: str | None, prescale_factor: float, postscale_factor: float,
                       process_set: ProcessSet | None, compression: Any, inplace: bool) -> tuple[Request, Any]:
    st = _state_or_raise()
    kind = ALLREDUCE
    t, is_np = _as_torch(tensor, "allreduce: tensor")
    rop = _op(op, "allreduce")
    if t.dtype not in _NUMERIC:
        raise DataError(f"allreduce: dtype {t.dtype} cannot be reduced; use one of float16, bfloat16, float32, "
                        "float64, int32, int64 (or int8/uint8/int16)")
    _check_tensor(t, "allreduce", st)
    ps = _resolve_ps(st, process_set, "allreduce")
    if compression is None:
        comp, comp_name = _comp.NoneCompressor, "none"
    else:
        comp = _comp.resolve(compression)
        comp_name = _comp.name_of(comp)
    src = t if t.is_contiguous() else t.contiguous()
    if inplace:
        out = src
    else:
        out = torch.empty_like(src)
    req = Request(kind, _name(st, kind, name), ps.process_set_id, tensor=src, output=out, op=rop,
                  prescale=prescale_factor, postscale=postscale_factor, compressor=comp, comp_name=comp_name)

    if inplace and src is t:
        return req, lambda result: tensor
    if not inplace and not is_np:
        return req, None

    def post(result: torch.Tensor) -> Any:
        if inplace:
            t.copy_(src)
            return tensor
        return _ret(result, is_np)

    return req, post


def end_burst() -> None:
    """Tell the engine that a group of submissions is complete (a bucket of gradients):
    it negotiates what it has gathered now rather than waiting for the burst to settle."""
    st = _state
    if st is not None:
        st.engine.end_burst()


def _submit(req: Request, post: Any) -> Handle:
    h = _state_or_raise().engine.submit(req)
    if post is not None:
        h._post = post
    return h


def allreduce_async(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: ProcessSet | None = None,
                    compression: Any = None) -> Handle:
    """Start reducing ``tensor`` across the process set; return a :class:`Handle` whose
    ``synchronize()`` gives a new tensor (or array) with the result."""
    return _submit(*_allreduce_request(tensor, op, name, prescale_factor, postscale_factor, process_set,
                                       compression, inplace=False))


def allreduce_async_(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: ProcessSet | None = None,
                     compression: Any = None) -> Handle:
    """In-place :func:`allreduce_async`: the result is written into ``tensor``."""
    st = _state
    if (st is not None and type(tensor) is torch.Tensor and process_set is None and compression is None
            and type(op) is ReduceOp and tensor.is_cpu and tensor.dtype in _NUMERIC and tensor.is_contiguous()):
        # the hot path of gradient reduction: same checks, none of the general machinery
        if name is None:
            name = st.auto_name(ALLREDUCE)
        elif type(name) is not str or not name:
            raise ConfigError(f"allreduce: name must be a non-empty string, got {name!r}")
        return st.engine.submit(fast_allreduce_request(name, tensor, tensor, op, float(prescale_factor),
                                                       float(postscale_factor)))
    return _submit(*_allreduce_request(tensor, op, name, prescale_factor, postscale_factor, process_set,
                                       compression, inplace=True))


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
    if name is None:
        name = st.auto_name(ALLREDUCE)
    elif type(name) is not str or not name:
        raise ConfigError(f"allreduce: name must be a non-empty string, got {name!r}")
    tensor = room[:numel]
    return st.engine.submit(fast_allreduce_request(name, tensor, tensor, _op(op, "allreduce"), 1.0,
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
    return allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set,
                           compression).synchronize()


def allreduce_(tensor: Any, op: Any = Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: ProcessSet | None = None, compression: Any = None) -> Any:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set,
                            compression).synchronize()


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
    base = _name(st, "grouped_allreduce", name)
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
def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Handle:
    """Start concatenating every member's ``tensor`` along dim 0 (dim 0 may differ by rank)."""
    st = _state_or_raise()
    t, is_np = _as_torch(tensor, "allgather: tensor")
    _check_tensor(t, "allgather", st)
    if t.dim() == 0:
        t = t.reshape(1)
    ps = _resolve_ps(st, process_set, "allgather")
    req = Request(ALLGATHER, _name(st, ALLGATHER, name), ps.process_set_id, tensor=t.contiguous())
    return _submit(req, lambda r: _ret(r, is_np))


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Concatenate every member's ``tensor`` along dim 0, in rank order.

    Raises:
        CollectiveError: ranks disagree on dtype or on the dimensions after the first.
    """
    return allgather_async(tensor, name, process_set).synchronize()


def _broadcast_async(tensor: Any, root_rank: int, name: str | None, process_set: ProcessSet | None,
                     inplace: bool) -> Handle:
    st = _state_or_raise()
    t, is_np = _as_torch(tensor, "broadcast: tensor")
    _check_tensor(t, "broadcast", st)
    ps = _resolve_ps(st, process_set, "broadcast")
    ranks = ps.ranks if ps.ranks is not None else list(range(st.size))
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ranks:
        raise ConfigError(f"broadcast: root_rank={root_rank!r} is not a rank of {ps!r} (ranks {ranks})")
    src = t if t.is_contiguous() else t.contiguous()
    out = src if inplace else src.clone()
    req = Request(BROADCAST, _name(st, BROADCAST, name), ps.process_set_id, tensor=src, output=out,
                  root=int(root_rank))

    def post(result: torch.Tensor) -> Any:
        if inplace:
            if src is not t:
                t.copy_(src)
            return tensor
        return _ret(result, is_np)

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
    t, is_np = _as_torch(tensor, "alltoall: tensor")
    _check_tensor(t, "alltoall", st)
    if t.dim() == 0:
        raise DataError("alltoall: tensor must have at least one dimension")
    ps = _resolve_ps(st, process_set, "alltoall")
    n = len(ps.ranks) if ps.ranks is not None else st.size
    rows = t.shape[0]
    if splits is None:
        if rows % n:
            raise DataError(f"alltoall: dim 0 ({rows}) is not divisible by the {n} ranks; pass splits=")
        split_list = [rows // n] * n
    else:
        if isinstance(splits, torch.Tensor):
            splits = splits.tolist()
        elif isinstance(splits, np.ndarray):
            splits = splits.tolist()
        try:
            split_list = [int(s) for s in splits]
        except (TypeError, ValueError):
            raise ConfigError(f"alltoall: splits must be a sequence of integers, got {splits!r}") from None
        if len(split_list) != n:
            raise ConfigError(f"alltoall: splits has {len(split_list)} entries but the process set has {n} ranks")
        if any(s < 0 for s in split_list) or sum(split_list) != rows:
            raise ConfigError(f"alltoall: splits {split_list} must be >= 0 and sum to dim 0 ({rows})")
    req = Request(ALLTOALL, _name(st, ALLTOALL, name), ps.process_set_id, tensor=t.contiguous(),
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


def reducescatter_async(tensor: Any, op: Any = Average, name: str | None = None,
                        process_set: ProcessSet | None = None) -> Handle:
    """Start a reduce-scatter: reduce ``tensor`` and give member i the i-th block of dim 0
    (blocks as even as possible, the first ranks get one extra row)."""
    st = _state_or_raise()
    t, is_np = _as_torch(tensor, "reducescatter: tensor")
    rop = _op(op, "reducescatter")
    if t.dtype not in _NUMERIC:
        raise DataError(f"reducescatter: dtype {t.dtype} cannot be reduced")
    _check_tensor(t, "reducescatter", st)
    if t.dim() == 0:
        raise DataError("reducescatter: tensor must have at least one dimension")
    ps = _resolve_ps(st, process_set, "reducescatter")
    req = Request(REDUCESCATTER, _name(st, REDUCESCATTER, name), ps.process_set_id, tensor=t.contiguous(), op=rop)
    return _submit(req, lambda r: _ret(r, is_np))


def reducescatter(tensor: Any, op: Any = Average, name: str | None = None,
                  process_set: ProcessSet | None = None) -> Any:
    """Reduce ``tensor`` across members and return this member's block of dim 0."""
    return reducescatter_async(tensor, op, name, process_set).synchronize()


# ---------------------------------------------------------------------------------------
# barrier, join, objects, process sets
# ---------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet | None = None) -> None:
    """Return once every member of ``process_set`` has called barrier."""
    st = _state_or_raise()
    ps = _resolve_ps(st, process_set, "barrier")
    req = Request(BARRIER, st.auto_name(f"barrier.ps{ps.process_set_id}"), ps.process_set_id)
    _submit(req, None).synchronize()


def join() -> int:
    """Declare that this rank has no more data; until every rank has joined, this rank
    contributes zeros to the other ranks' allreduces. Returns the last rank to join."""
    st = _state_or_raise()
    req = Request(JOIN, st.auto_name(JOIN), 0)
    return int(_submit(req, None).synchronize())


def _dumps(obj: Any) -> bytes:
    try:
        import cloudpickle

        return cloudpickle.dumps(obj)
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` (pickled with cloudpickle) on every member."""
    st = _state_or_raise()
    base = _name(st, "broadcast_object", name)
    payload = _dumps(obj) if st.rank == root_rank else b""
    n = torch.tensor([len(payload)], dtype=torch.int64)
    n = broadcast_(n, root_rank, name=f"{base}.size", process_set=process_set)
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if st.rank == root_rank else \
        torch.empty(int(n.item()), dtype=torch.uint8)
    if buf.numel() == 0:
        buf = torch.empty(0, dtype=torch.uint8)
    broadcast_(buf, root_rank, name=f"{base}.data", process_set=process_set)
    return obj if st.rank == root_rank else pickle.loads(buf.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return the list of every member's ``obj``, in rank order."""
    st = _state_or_raise()
    base = _name(st, "allgather_object", name)
    payload = _dumps(obj)
    sizes = allgather(torch.tensor([len(payload)], dtype=torch.int64), name=f"{base}.size", process_set=process_set)
    data = allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else
                     torch.empty(0, dtype=torch.uint8), name=f"{base}.data", process_set=process_set)
    raw = data.numpy().tobytes()
    out, off = [], 0
    for s in sizes.tolist():
        out.append(pickle.loads(raw[off : off + s]))
        off += s
    return out


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; every rank must call this with the same ranks in the same order.

    Raises:
        ConfigError: ranks outside the job, or the set is already registered.
        CollectiveError: ranks registered different sets.
    """
    st = _state_or_raise()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ConfigError(f"{ps!r} is already registered")
    if ps.ranks is None:
        raise ConfigError("the global process set is always registered")
    bad = [r for r in ps.ranks if not 0 <= r < st.size]
    if bad:
        raise ConfigError(f"process set ranks {bad} are outside the job's ranks [0, {st.size})")
    with st.lock:
        ps_id = st.next_ps_id
        st.next_ps_id += 1
    req = Request(PS_ADD, f"process_set.add.{ps_id}", 0, extra=(ps_id, tuple(ps.ranks)))
    _submit(req, None).synchronize()
    ps._bind(ps_id, list(ps.ranks))
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (collective over every rank). Returns True if it was registered."""
    _state_or_raise()  # NotInitializedError before init()
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False
    ps_id = process_set.process_set_id
    req = Request(PS_REMOVE, f"process_set.remove.{ps_id}", 0, extra=ps_id)
    _submit(req, None).synchronize()
    process_set.process_set_id = None
    return True


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
