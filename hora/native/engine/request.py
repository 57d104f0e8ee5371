"""What a rank submits: the op kinds, an op's key (named fields), requests and handles.

The :class:`OpKey` is what ranks must agree on for a name: it travels to every rank in
a round's metadata, and a mismatch in any field is reported by field name
(:func:`mismatch_message`). A :class:`Request` is one op as submitted on this rank; it
is also the :class:`Handle` the caller waits on.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch

from hora.errors import CollectiveError
from hora.native.backends.base import ReduceOp
from hora.native.compression import NoneCompressor
from hora.native.engine.config import ENV_OP_TIMEOUT, EngineConfig


class OpKind(enum.StrEnum):
    """The kinds of request (equal to, and hashing like, their string values)."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"
    PS_ADD = "process_set_add"
    PS_REMOVE = "process_set_remove"
    QUIT = "shutdown"  # not an op: a rank's announcement, in a round's metadata, that it shut down


ALLREDUCE = OpKind.ALLREDUCE
ALLGATHER = OpKind.ALLGATHER
BROADCAST = OpKind.BROADCAST
ALLTOALL = OpKind.ALLTOALL
REDUCESCATTER = OpKind.REDUCESCATTER
BARRIER = OpKind.BARRIER
JOIN = OpKind.JOIN
PS_ADD = OpKind.PS_ADD
PS_REMOVE = OpKind.PS_REMOVE
QUIT = OpKind.QUIT
UNCACHEABLE = frozenset({JOIN, PS_ADD, PS_REMOVE})
_AUTO = ".noname."  # the mark of a name made up for an unnamed op


def auto_name(kind: str, process_set_id: int, n: int) -> str:
    """The name of the ``n``-th unnamed ``kind`` op over process set ``process_set_id``
    (every member counts alike, so the names match across ranks)."""
    return f"{kind}{_AUTO}{n}" if process_set_id == 0 else f"{kind}.ps{process_set_id}{_AUTO}{n}"


def is_one_off(name: str) -> bool:
    """Whether ``name`` is one made up for an unnamed op (:func:`auto_name`, and the
    grouped ops' ``<auto name>.<i>``): it never comes again, so the engine does not keep
    it in the response cache, and a round that negotiates nothing else by name does not
    break the chain of predicted rounds (a training step with an unnamed metric allreduce
    or a barrier stays predicted)."""
    return _AUTO in name


ROOM = "room"  # OpKey.extra of an allreduce whose tensor has spare room after it (see fast_allreduce_request)


class OpKey(NamedTuple):
    """What every rank must agree on for one name (per-rank data such as allgather's
    first dimension is not part of it: see ``Request.local``)."""

    kind: str
    dtype: str  # "" for ops without a tensor
    shape: tuple  # allgather/alltoall: the shape without dim 0
    ndim: int
    op: int  # ReduceOp value
    root_rank: int
    process_set: int
    prescale_factor: float
    postscale_factor: float
    compression: str
    device: str
    extra: Any  # process-set ops: their ids and ranks; ROOM: a bucket with spare room


#: the key a rank sends once when it shuts down (see Negotiator.process_metas)
QUIT_KEY = OpKey(QUIT, "", (), 0, 0, -1, 0, 1.0, 1.0, "none", "", None)
_new_key = tuple.__new__  # OpKey without the keyword machinery: the submit hot path

DTYPE_NAMES = {getattr(torch, n): n for n in (
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")}


class HandleOwner(Protocol):
    """What a handle needs of the engine it was submitted to (:class:`~.engine.Engine`)."""

    config: EngineConfig

    @property
    def done_cond(self) -> threading.Condition: ...

    def kick(self) -> None: ...

    def poke(self) -> None: ...

    def request_flush(self, handle: Handle) -> None: ...

    def end_flush(self, handle: Handle) -> None: ...

    def describe_waiting(self, name: str) -> str: ...


class Handle:
    """The future of one submitted op. ``poll()`` never blocks; ``synchronize()`` waits.

    ``synchronize`` returns the op's result (after the op layer's post-processing) or
    raises :class:`~hora.errors.CollectiveError`.
    """

    # class-level defaults: a request (a subclass) sets only what differs, which keeps
    # the submit path of thousands of small tensors per step cheap
    name: str = ""
    kind: str = ""
    _done = False
    _result: Any = None
    _error: BaseException | None = None
    _engine: HandleOwner | None = None
    _post: Callable[[Any], Any] | None = None
    _finished = False
    _done_value: Any = None

    def __init__(self, name: str, kind: str, engine: HandleOwner | None) -> None:
        self.name = name
        self.kind = kind
        self._engine = engine

    def poll(self) -> bool:
        """True when the op has finished (successfully or not); never blocks."""
        if self._done:
            return True
        if self._engine is not None:
            self._engine.kick()  # a round waiting for a blocking caller runs now
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        """Block until the op finishes (no result, no raise on error).

        Raises:
            CollectiveError: it did not finish within ``timeout`` seconds (default
                ``HORA_OP_TIMEOUT``), naming the tensor and the ranks never heard from.
        """
        if self._done:
            return
        engine = self._engine
        if engine is None:  # pragma: no cover - handles always belong to an engine
            raise CollectiveError(f"{self.kind} '{self.name}' has no engine")
        limit = timeout if timeout is not None else engine.config.op_timeout
        engine.request_flush(self)
        try:
            deadline = time.monotonic() + limit
            poll = engine.config.stall_poll
            cond = engine.done_cond
            with cond:
                while not self._done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        detail = engine.describe_waiting(self.name)
                        raise CollectiveError(
                            f"{self.kind} '{self.name}' did not complete within {limit:g}s{detail} "
                            f"(raise {ENV_OP_TIMEOUT} to wait longer)"
                        )
                    if poll is None or left <= poll:
                        cond.wait(left)
                    elif not cond.wait(poll) and not self._done:
                        # the job may be idle with this op pending: a round runs the stall checks
                        engine.poke()
        finally:
            engine.end_flush(self)

    def synchronize(self, timeout: float | None = None) -> Any:
        """Wait for the op and return its result.

        Raises:
            CollectiveError: the op failed on this rank (mismatch across ranks, backend
                failure, stall shutdown) or timed out.
        """
        if self._finished:
            return self._done_value
        if self._done and self._post is None and self._error is None:
            return self._result  # the common case, kept cheap for loops over many handles
        self.wait(timeout)
        if self._error is not None:
            raise self._error
        value = self._result
        if self._post is not None:
            value = self._post(value)
        self._finished = True
        self._done_value = value
        self._result = None
        return value

    def __repr__(self) -> str:
        return f"<hora Handle {self.kind} '{self.name}' {'done' if self._done else 'pending'}>"


class Request(Handle):
    """One op as submitted on this rank; it is also the :class:`Handle` returned to the caller.

    ``output`` None for an allreduce: the engine makes the result tensor (out of place,
    see :mod:`hora.native.engine.fusion`); else the result is written into ``output``.
    """

    ps_id = 0
    tensor: torch.Tensor | None = None
    output: torch.Tensor | None = None
    op: ReduceOp = ReduceOp.Sum
    root = -1
    prescale = 1.0
    postscale = 1.0
    compressor: Any = NoneCompressor
    comp_name = "none"
    splits: tuple[int, ...] | None = None
    extra: Any = None
    entry: Any = None  # its cache.CacheEntry once matched (the cache module builds on this one)
    reported = False
    t_submit = 0.0
    t_ready = 0.0
    ready_event: Any = None
    key: OpKey = QUIT_KEY
    local: Any = None
    staged = 0  # the engine's staging token when the tensor was copied into the fusion buffer at submit
    room: torch.Tensor | None = None  # 1-D buffer starting with the tensor, with spare room after it

    @property
    def handle(self) -> Request:
        return self

    def __init__(
        self,
        kind: str,
        name: str,
        ps_id: int,
        tensor: torch.Tensor | None = None,
        output: torch.Tensor | None = None,
        op: ReduceOp = ReduceOp.Sum,
        root: int = -1,
        prescale: float = 1.0,
        postscale: float = 1.0,
        compressor: Any = NoneCompressor,
        comp_name: str = "none",
        splits: tuple[int, ...] | None = None,
        extra: Any = None,
    ) -> None:
        self.kind = kind
        # names are matched within a process set, as in Horovod: the same name in two
        # sets is two ops (the set is part of the name the engine negotiates)
        self.name = name if not ps_id else f"{name} (process set {ps_id})"
        self.ps_id = ps_id
        self.tensor = tensor
        self.output = output
        self.op = op
        self.root = root
        self.prescale = float(prescale)
        self.postscale = float(postscale)
        self.compressor = compressor
        self.comp_name = comp_name
        self.splits = splits
        self.extra = extra
        t = tensor
        if t is None:
            shape: tuple = ()
            dtype = ""
            device = ""
        else:
            shape = tuple(t.shape)
            dtype = DTYPE_NAMES.get(t.dtype) or str(t.dtype).replace("torch.", "")
            if t.is_cuda:
                device = "cuda"
                # the engine thread waits for the caller's stream to have produced the input
                self.ready_event = torch.cuda.Event()
                self.ready_event.record()
            else:
                device = "cpu" if t.is_cpu else t.device.type
        if kind in (ALLGATHER, ALLTOALL):
            # dim 0 may differ by rank: it is per-rank data, not part of the agreement
            self.key = OpKey(kind, dtype, shape[1:], len(shape), int(op), root, ps_id, self.prescale,
                             self.postscale, comp_name, device, extra)
            self.local = (shape[0] if shape else 1, splits)
        else:
            self.key = OpKey(kind, dtype, shape, len(shape), int(op), root, ps_id, self.prescale, self.postscale,
                             comp_name, device, extra)
            self.local = None


def fast_allreduce_request(name: str, tensor: torch.Tensor, output: torch.Tensor | None, op: ReduceOp,
                           prescale: float, postscale: float, room: torch.Tensor | None = None,
                           dtype: torch.dtype | None = None) -> Request:
    """A :class:`Request` for the common case (contiguous CPU tensor, global set, no
    compression), built without the general constructor's checks: the submit hot path.

    ``output``: ``tensor`` itself (in place), or None: the engine makes the result.
    ``room``: an in-place request's tensor is the start of this 1-D buffer, which has
    :meth:`Engine.room_elements` spare elements after it; a predicted round then runs in
    place, with the control vector in the spare room (``room`` is part of the key: every
    rank must pass it alike). ``dtype``: ``tensor.dtype``, when the caller has it."""
    r = _FastAllreduce.__new__(_FastAllreduce)  # (kind, and the op's default, from the class)
    r.name = name
    r.tensor = tensor
    if output is not None:
        r.output = output
    if op is not _SUM:
        r.op = op
    if dtype is None:
        dtype = tensor.dtype
    if room is not None or prescale != 1.0 or postscale != 1.0:
        if prescale != 1.0:
            r.prescale = prescale
        if postscale != 1.0:
            r.postscale = postscale
        if room is not None:
            r.room = room
        cached: tuple = (tensor.shape, dtype, op, prescale, postscale, room is None)
    else:
        cached = (tensor.shape, dtype, op)  # (the common case: a shorter key to hash)
    key = _FAST_KEYS.get(cached)
    if key is None:  # (a loop over the same tensors builds each key once)
        if len(_FAST_KEYS) >= 4096:
            _FAST_KEYS.clear()
        shape = tuple(tensor.shape)
        key = _FAST_KEYS[cached] = _new_key(OpKey, (
            ALLREDUCE, DTYPE_NAMES[dtype], shape, len(shape), op.value, -1, 0, prescale, postscale, "none",
            "cpu", None if room is None else ROOM))
    r.key = key
    return r


_FAST_KEYS: dict[tuple, OpKey] = {}  # fast_allreduce_request's keys by shape, dtype, op (, scales, room)
_SUM = ReduceOp.Sum


class _FastAllreduce(Request):
    """A request made by :func:`fast_allreduce_request`: an allreduce, Sum unless set."""

    kind = ALLREDUCE


def describe_key(key: OpKey) -> str:
    """``key`` in words, for error messages (``allreduce float32[4] op=Sum``)."""
    parts = [str(key.kind)]
    if key.dtype:
        shown = ("?",) + tuple(key.shape) if key.kind in (ALLGATHER, ALLTOALL) else tuple(key.shape)
        parts.append(f"{key.dtype}{list(shown)}")
    if key.kind in (ALLREDUCE, REDUCESCATTER):
        parts.append(f"op={ReduceOp(key.op).name}")
    if key.kind == BROADCAST:
        parts.append(f"root_rank={key.root_rank}")
    if key.process_set:
        parts.append(f"process_set={key.process_set}")
    if key.prescale_factor != 1.0 or key.postscale_factor != 1.0:
        parts.append(f"prescale={key.prescale_factor:g} postscale={key.postscale_factor:g}")
    if key.compression != "none":
        parts.append(f"compression={key.compression}")
    if key.extra == ROOM:
        parts.append("with spare room (a DistributedOptimizer bucket)")
    elif key.extra is not None:
        parts.append(f"ranks={list(key.extra)}")
    return " ".join(parts)


def mismatch_message(name: str, keys: dict[int, OpKey]) -> str:
    """The error every rank that submitted ``name`` gets when ranks' keys differ: the
    fields that differ, and each group of ranks with its key in words."""
    ranks = sorted(keys)
    fields = [f for i, f in enumerate(OpKey._fields) if len({k[i] for k in keys.values()}) > 1]
    groups: dict[tuple, list[int]] = {}
    for r in ranks:
        groups.setdefault(keys[r], []).append(r)
    detail = "; ".join(f"rank(s) {rs}: {describe_key(OpKey(*k))}" for k, rs in groups.items())
    return (f"mismatched collective '{name}': ranks {ranks} disagree on {', '.join(fields) or 'metadata'} "
            f"({detail})")


def numel_of(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_ITEMSIZE: dict[str, int] = {}


def itemsize(dtype: str) -> int:
    """Bytes per element of the dtype named ``dtype``."""
    s = _ITEMSIZE.get(dtype)
    if s is None:
        s = _ITEMSIZE[dtype] = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return s
