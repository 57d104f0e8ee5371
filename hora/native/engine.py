"""The collective engine: name-matched negotiation, response cache, fusion, stalls.

One background thread per process owns the backend. Callers enqueue named requests
(:meth:`Engine.submit`) and get a :class:`Handle`. While the job has outstanding work,
every rank's thread runs *rounds* in lockstep; a round is itself a collective:

1. a small ``MIN`` allreduce of a control vector: one bit per response-cache slot
   ("I have a request pending that matches this cached response"), the same bits
   inverted (so the minimum gives "some rank has it", for stall detection), and a few
   flags (anything uncached? its size, anything pending at all, the clock);
2. only when some rank has requests that are not in the cache: an allgather of their
   metadata (name, kind, dtype, shape, op, process set, ...).

Every rank then runs the same deterministic bookkeeping on the same inputs, so every
rank derives the same ordered list of ready responses: a name is ready when every rank
of its process set has submitted it (a rank outside the set votes "ready" for it). The order in which ranks submitted never matters.
Mismatched metadata becomes an error response on every rank that submitted the name
(and on those that submit it later). Ready allreduces of one dtype, op, process set,
scale and compression are packed into a reusable fusion buffer up to the fusion
threshold and reduced by one backend call.

Predicted rounds: steady-state training repeats its rounds (the same gradients every
step), so every rank records which round followed which and, once a successor has
repeated, predicts the next one. A predicted round that is one fused float Sum/Average
allreduce of the global set runs as ONE collective: the control vector, encoded as
counts, rides at the end of the fusion buffer of one Sum allreduce; if some rank did not
hold the whole prediction, the data part is discarded and the round goes on as a normal
one (see ``Engine._spec_collective``). A lone tensor whose buffer keeps spare room after it
(``ops.bucket_allreduce_async_``: DistributedOptimizer's flat buckets) is reduced in place,
the control vector in its room: no copy at all. While a prediction stands (also one that
cannot ride along and is negotiated as a normal round), ranks wait for their own
part locally, with no wake-up through the store; a big predicted tensor is copied into its
place in the fusion buffer when it is submitted (hot in the cache); and once a rank holds
the whole prediction, a caller that blocks on a handle runs the round in its own thread.
``HORA_SPECULATE=0`` turns this off. ``ops.end_burst()`` (called by DistributedOptimizer
after each bucket) ends a burst's gathering at once, so buckets become rounds of their own.

Shutdown is collective: a rank that has shut down keeps answering rounds until every
rank has (``HORA_SHUTDOWN_TIMEOUT``), so ranks still working are not cut off; the round
after its shutdown tells every rank, and an op that needs its part then fails at once.
Op errors (mismatches, bad arguments, a rank that joined or shut down) fail only the ops
concerned; the engine stops only when a rank is lost (its sockets close, the store is
gone) or on a bug. The thread is joined before anything it uses is released
(:meth:`Engine.shutdown`, :meth:`Engine.on_exit`).

After a round every rank's thread goes idle (a decision every rank takes alike, from the
round's job-wide results) and blocks on a job-wide wake-up signal
(:class:`~hora.native.backends.base.Waker`); the next submission anywhere signals it.
So a synchronous op costs one wake-up through the store plus its round, and ranks that
wait for a late peer do not poll the job with collective rounds (each round is a
collective: on a busy machine it costs more than a wake-up, and it takes CPU from the
late rank). Rounds follow each other directly only while a rank has joined, after the
response cache dropped a slot (its requests are renegotiated by name), or while
``HORA_LINGER_ROUNDS`` asks for it. A caller blocked on a handle wakes the job every
quarter of the stall check time, so stalls are still detected and reported.

Environment: ``HORA_CYCLE_TIME`` (ms between rounds while active, default 1),
``HORA_FUSION_THRESHOLD`` (bytes, default 64 MiB; 0 disables fusion),
``HORA_CACHE_CAPACITY`` (response-cache slots, default 1024; 0 disables it),
``HORA_STALL_CHECK_TIME`` (s, default 60; 0 disables), ``HORA_STALL_SHUTDOWN_TIME``
(s, default 0 = never), ``HORA_OP_TIMEOUT`` (s a ``synchronize`` waits, default 600),
``HORA_SHUTDOWN_TIMEOUT`` (s, default 30), ``HORA_SPECULATE`` (default 1), ``HORA_LINGER_ROUNDS`` (rounds without results,
one per cycle, before going idle; default 0), ``HORA_AUTOTUNE=1`` (``HORA_AUTOTUNE_WINDOW`` working rounds per
candidate, default 20), ``HORA_TIMELINE``. The backends' own collective timeout is
``HORA_COLLECTIVE_TIMEOUT`` (s, default 300); ranks on one host allreduce through shared
memory unless ``HORA_SHM_ALLREDUCE=0`` (``HORA_SHM_BUFFER_MB``, default 8: see
:mod:`hora.native.backends.shm`).

Semantics worth knowing: integer Average rounds toward zero (as Horovod); a name may be
in flight only once per rank and process set; a burst of submissions is gathered (up to
10 cycles, ended early by any caller that blocks on a handle) before it is negotiated, so
it is fused.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hora.errors import CollectiveError, ConfigError
from hora.native import adasum
from hora.native.backends.base import Backend, Group, ReduceOp
from hora.native.compression import NoneCompressor
from hora.native.timeline import Timeline

log = logging.getLogger(__name__)

ENV_CYCLE_TIME = "HORA_CYCLE_TIME"
ENV_FUSION_THRESHOLD = "HORA_FUSION_THRESHOLD"
ENV_CACHE_CAPACITY = "HORA_CACHE_CAPACITY"
ENV_STALL_CHECK_TIME = "HORA_STALL_CHECK_TIME"
ENV_STALL_SHUTDOWN_TIME = "HORA_STALL_SHUTDOWN_TIME"
ENV_OP_TIMEOUT = "HORA_OP_TIMEOUT"
ENV_AUTOTUNE = "HORA_AUTOTUNE"
ENV_SHUTDOWN_TIMEOUT = "HORA_SHUTDOWN_TIMEOUT"
ENV_LINGER_ROUNDS = "HORA_LINGER_ROUNDS"
ENV_SPECULATE = "HORA_SPECULATE"

DEFAULT_CYCLE_TIME_MS = 1.0
DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024
DEFAULT_CACHE_CAPACITY = 1024
DEFAULT_STALL_CHECK_TIME = 60.0
DEFAULT_STALL_SHUTDOWN_TIME = 0.0
DEFAULT_OP_TIMEOUT = 600.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
DEFAULT_LINGER_ROUNDS = 0
ROOM = "room"  # key extra of an allreduce whose tensor has spare room after it (see fast_allreduce_request)
SPEC_SINGLE_MAX_BYTES = 1 << 20  # a predicted round of one tensor above this runs as a normal round
STAGE_MIN_NUMEL = 16384  # elements: a predicted tensor at least this big is staged at submit
IDLE_POLL = 60.0  # seconds an idle thread blocks before re-checking (shutdown wakes it at once)
MIN_STALL_POLL = 0.05  # seconds: the fastest a blocked caller re-runs the stall checks

# request kinds
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
_UNCACHEABLE = (JOIN, PS_ADD, PS_REMOVE)
# the metadata a rank sends once when it shuts down (see Engine._process_metas)
_QUIT_KEY = (QUIT, "", (), 0, 0, -1, 0, 1.0, 1.0, "none", "", None)
ABORT_JOIN_TIMEOUT = 5.0  # seconds shutdown waits for an interrupted engine thread before leaving it


def _env_number(name: str, default: float, *, allow_zero: bool = True) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={raw!r} must be {'>= 0' if allow_zero else '> 0'}")
    return value


class EngineConfig:
    """Tunables of the engine, read from the environment (see the module docstring)."""

    def __init__(self) -> None:
        self.cycle_time = _env_number(ENV_CYCLE_TIME, DEFAULT_CYCLE_TIME_MS) / 1000.0
        self.fusion_threshold = int(_env_number(ENV_FUSION_THRESHOLD, DEFAULT_FUSION_THRESHOLD))
        self.cache_capacity = int(_env_number(ENV_CACHE_CAPACITY, DEFAULT_CACHE_CAPACITY))
        self.stall_check_time = _env_number(ENV_STALL_CHECK_TIME, DEFAULT_STALL_CHECK_TIME)
        self.stall_shutdown_time = _env_number(ENV_STALL_SHUTDOWN_TIME, DEFAULT_STALL_SHUTDOWN_TIME)
        self.op_timeout = _env_number(ENV_OP_TIMEOUT, DEFAULT_OP_TIMEOUT, allow_zero=False)
        self.shutdown_timeout = _env_number(ENV_SHUTDOWN_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, allow_zero=False)
        self.autotune = os.environ.get(ENV_AUTOTUNE, "").strip().lower() in ("1", "true", "yes", "on")
        # rounds without results the engine runs (one per cycle) before it goes idle; 0 (the
        # default): idle after every round, so every round starts from a wake-up through the
        # store, which costs less than one more collective round (job-wide, see Engine._round)
        self.linger_rounds = int(_env_number(ENV_LINGER_ROUNDS, DEFAULT_LINGER_ROUNDS))
        # predicted rounds carry their data in the negotiation's collective (Engine._spec_collective)
        self.speculate = os.environ.get(ENV_SPECULATE, "1").strip().lower() not in ("0", "false", "no", "off")

    @property
    def stall_poll(self) -> float | None:
        """Seconds between the wake-ups a blocked caller sends so that idle engines run
        the stall checks; None when stall checks are off."""
        times = [t for t in (self.stall_check_time, self.stall_shutdown_time) if t > 0]
        if self.stall_check_time <= 0 or not times:
            return None
        return min(IDLE_POLL, max(MIN_STALL_POLL, min(times) / 4))


# ---------------------------------------------------------------------------------------
# Requests and handles
# ---------------------------------------------------------------------------------------
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
    _engine: Engine | None = None
    _post: Callable[[Any], Any] | None = None
    _finished = False
    _done_value: Any = None

    def __init__(self, name: str, kind: str, engine: Engine | None) -> None:
        self.name = name
        self.kind = kind
        self._engine = engine

    def poll(self) -> bool:
        """True when the op has finished (successfully or not); never blocks."""
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
            cond = engine._done_cond
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
    """One op as submitted on this rank; it is also the :class:`Handle` returned to the caller."""

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
    entry: CacheEntry | None = None
    reported = False
    t_submit = 0.0
    t_ready = 0.0
    ready_event: Any = None
    key: tuple = ()
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
            dtype = _DTYPE_NAMES.get(t.dtype) or str(t.dtype).replace("torch.", "")
            if t.is_cuda:
                device = "cuda"
                # the engine thread waits for the caller's stream to have produced the input
                self.ready_event = torch.cuda.Event()
                self.ready_event.record()
            else:
                device = "cpu" if t.is_cpu else t.device.type
        if kind in (ALLGATHER, ALLTOALL):
            # dim 0 may differ by rank: it is per-rank data, not part of the agreement
            self.key = (kind, dtype, shape[1:], len(shape), int(op), root, ps_id, self.prescale, self.postscale,
                        comp_name, device, extra)
            self.local = (shape[0] if shape else 1, splits)
        else:
            self.key = (kind, dtype, shape, len(shape), int(op), root, ps_id, self.prescale, self.postscale,
                        comp_name, device, extra)
            self.local = None


def fast_allreduce_request(name: str, tensor: torch.Tensor, output: torch.Tensor, op: ReduceOp, prescale: float,
                           postscale: float, room: torch.Tensor | None = None) -> Request:
    """A :class:`Request` for the common case (contiguous CPU tensor, global set, no
    compression), built without the general constructor's checks: the submit hot path.

    ``room``: an in-place request's tensor is the start of this 1-D buffer, which has
    :meth:`Engine.room_elements` spare elements after it; a predicted round then runs in
    place, with the control vector in the spare room (``room`` is part of the key: every
    rank must pass it alike)."""
    r = Request.__new__(Request)
    r.kind = ALLREDUCE
    r.name = name
    r.tensor = tensor
    r.output = output
    r.op = op
    if prescale != 1.0:
        r.prescale = prescale
    if postscale != 1.0:
        r.postscale = postscale
    if room is not None:
        r.room = room
    r.key = (ALLREDUCE, _DTYPE_NAMES[tensor.dtype], tuple(tensor.shape), tensor.dim(), op.value, -1, 0, prescale,
             postscale, "none", "cpu", None if room is None else ROOM)
    return r


_DTYPE_NAMES = {getattr(torch, n): n for n in (
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")}

_KEY_FIELDS = ("kind", "dtype", "shape", "ndim", "op", "root_rank", "process_set", "prescale_factor",
               "postscale_factor", "compression", "device", "extra")


def _describe_key(key: tuple) -> str:
    kind, dtype, shape, ndim, op, root, ps_id, pre, post, comp, device, extra = key
    parts = [kind]
    if dtype:
        shown = ("?",) + tuple(shape) if kind in (ALLGATHER, ALLTOALL) else tuple(shape)
        parts.append(f"{dtype}{list(shown)}")
    if kind in (ALLREDUCE, REDUCESCATTER):
        parts.append(f"op={ReduceOp(op).name}")
    if kind == BROADCAST:
        parts.append(f"root_rank={root}")
    if ps_id:
        parts.append(f"process_set={ps_id}")
    if pre != 1.0 or post != 1.0:
        parts.append(f"prescale={pre:g} postscale={post:g}")
    if comp != "none":
        parts.append(f"compression={comp}")
    if extra == ROOM:
        parts.append("with spare room (a DistributedOptimizer bucket)")
    elif extra is not None:
        parts.append(f"ranks={list(extra)}")
    return " ".join(parts)


def _mismatch_message(name: str, keys: dict[int, tuple]) -> str:
    ranks = sorted(keys)
    fields = [f for i, f in enumerate(_KEY_FIELDS) if len({k[i] for k in keys.values()}) > 1]
    groups: dict[tuple, list[int]] = {}
    for r in ranks:
        groups.setdefault(keys[r], []).append(r)
    detail = "; ".join(f"rank(s) {rs}: {_describe_key(k)}" for k, rs in groups.items())
    return (f"mismatched collective '{name}': ranks {ranks} disagree on {', '.join(fields) or 'metadata'} "
            f"({detail})")


# ---------------------------------------------------------------------------------------
# Response cache (identical on every rank: only mutated by the deterministic round logic)
# ---------------------------------------------------------------------------------------
class _Response:
    """An agreed op, identical on every rank. Sizes and the fusion key are precomputed."""

    __slots__ = ("name", "key", "locals", "error", "seq", "extra_result", "kind", "ps_id", "numel", "nbytes",
                 "fkey")

    def __init__(self, name: str, key: tuple | None, locals_: dict[int, Any] | None, error: str | None = None,
                 seq: int = 0, extra_result: Any = None) -> None:
        self.name = name
        self.key = key
        self.locals = locals_
        self.error = error
        self.seq = seq
        self.extra_result = extra_result
        if key:
            self.kind = key[0]
            self.ps_id = key[6]
            self.numel = _numel(key[2]) if key[0] == ALLREDUCE else 0
            self.nbytes = self.numel * _itemsize(key[1]) if key[1] else 0
            # dtype, op, process set, prescale, postscale, compression, device
            self.fkey = (key[1], key[4], key[6], key[7], key[8], key[9], key[10])
        else:
            self.kind = ""
            self.ps_id = 0
            self.numel = self.nbytes = 0
            self.fkey = None


class CacheEntry(_Response):
    """A cached response; its ``slot`` is its bit in the negotiation's control vector."""

    __slots__ = ("slot",)

    def __init__(self, slot: int, name: str, key: tuple, locals_: dict[int, Any]) -> None:
        super().__init__(name, key, locals_)
        self.slot = slot


class ResponseCache:
    """LRU map name -> agreed response, with a fixed number of bit slots."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list[CacheEntry | None] = [None] * capacity
        self.by_name: dict[str, CacheEntry] = {}
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.free = list(range(capacity - 1, -1, -1))
        self.version = 0  # bumped on every insertion or removal (execution plans depend on it)
        self.evictions = 0  # removals only (a request may hold a dropped slot: renegotiate it)

    def lookup(self, req: Request, rank: int) -> CacheEntry | None:
        e = self.by_name.get(req.name)
        if e is not None and e.key == req.key and e.locals.get(rank) == req.local:
            return e
        return None

    def valid(self, e: CacheEntry) -> bool:
        return self.slots[e.slot] is e

    def erase(self, name: str) -> None:
        e = self.by_name.pop(name, None)
        if e is not None:
            self.version += 1
            self.evictions += 1
            self.slots[e.slot] = None
            self.lru.pop(e.slot, None)
            self.free.append(e.slot)

    def touch(self, e: CacheEntry) -> None:
        self.lru.move_to_end(e.slot)

    def put(self, name: str, key: tuple, locals_: dict[int, Any]) -> None:
        if self.capacity <= 0:
            return
        self.erase(name)
        if not self.free:
            victim, _ = self.lru.popitem(last=False)
            old = self.slots[victim]
            if old is not None:
                self.by_name.pop(old.name, None)
                self.evictions += 1
            self.slots[victim] = None
            self.free.append(victim)
        self.version += 1
        slot = self.free.pop()
        e = CacheEntry(slot, name, key, locals_)
        self.slots[slot] = e
        self.by_name[name] = e
        self.lru[slot] = None


class _Pending:
    """A name some ranks have submitted (replicated on every rank)."""

    __slots__ = ("name", "seq", "first", "keys", "locals", "rounds", "warned")

    def __init__(self, name: str, seq: int, first: int) -> None:
        self.name = name
        self.seq = seq
        self.first = first
        self.keys: dict[int, tuple] = {}
        self.locals: dict[int, Any] = {}
        self.rounds: dict[int, int] = {}
        self.warned = False


class ProcessSetInfo:
    """Engine-side record of a registered process set."""

    def __init__(self, ps_id: int, ranks: Sequence[int], group: Group) -> None:
        self.id = ps_id
        self.ranks = list(ranks)
        self.group = group  # on the CPU backend
        self.device_groups: dict[str, Group] = {"cpu": group}


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------
class Engine:
    """Background negotiation and execution of collectives (one per process)."""

    def __init__(self, backend: Backend, config: EngineConfig | None = None, timeline: Timeline | None = None,
                 device_backend_factories: dict[str, Callable[[], Backend]] | None = None) -> None:
        self.backend = backend
        self.device_backends: dict[str, Backend] = {"cpu": backend}
        self._device_factories = dict(device_backend_factories or {})
        self.rank = backend.rank
        self.size = backend.size
        self.config = config or EngineConfig()
        self.timeline = timeline or Timeline(None, self.rank)
        self.cache = ResponseCache(self.config.cache_capacity)
        self.process_sets: dict[int, ProcessSetInfo] = {0: ProcessSetInfo(0, range(self.size), backend.world)}
        self._waker = backend.make_waker()
        self._lock = threading.Lock()
        self._gather_cond = threading.Condition(self._lock)  # engine waits here for submissions to settle
        self._done_cond = threading.Condition(threading.Lock())  # callers wait here for their handles
        self._blocked: list[Handle] = []  # handles callers block on: rounds stop waiting for more work
        self._gathering = False
        self._completed: list[Handle] = []
        self._incoming: list[Request] = []
        self._names: dict[str, Request] = {}  # every request submitted here and not finished
        self._waiting: dict[str, Request] = {}  # reported to the negotiation, not finished
        self._table: dict[str, _Pending] = {}
        self._poisoned: dict[str, tuple[str, set[int]]] = {}
        self._joined: dict[int, int] = {}  # rank -> round its join arrived
        self._my_join_round: int | None = None
        self._slot_partial_since: dict[int, int] = {}
        self._seq = 0
        self._round_no = 0
        self._epoch = 0
        self._idle = False
        self._woken = False
        self._shutdown = False
        self._broken: BaseException | None = None
        self._fusion: dict[tuple, torch.Tensor] = {}
        self._plans: dict[bytes, tuple[tuple, list[Any]]] = {}
        self._to_forget: list[int] = []
        self._quiet_rounds = 0
        self._ps_version = 0
        self._nm_key: tuple = ()
        self._nm_slots: list[int] = []
        self._quit_announced = False  # this rank, done, asked for the round that may end the job
        self._quit_sent = False  # this rank told the others it shut down (QUIT metadata)
        self._quit: set[int] = set()  # ranks that have shut down (job-wide, from rounds' metadata)
        self._all_quit = False
        self._aborted = False  # shutdown gave up waiting for the others: leave at the next chance
        self._exit_lock = threading.Lock()
        self._exited = False  # the engine thread has ended
        self._on_exit: list[Callable[[], None]] = []
        # speculation (identical on every rank: only changed from rounds' job-wide results)
        self._spec: _Spec | None = None
        self._spec_allowed = False
        self._prev_bits: bytes | None = None
        self._succ: dict[bytes, list] = {}
        self._spec_missing: set[str] | None = None
        self._used_key: tuple = ()
        self._used = 0
        self._spec_memo: dict[tuple, _Spec | None] = {}  # predictions by bits and cache version
        self._spec_foreign = False
        self._spec_stage: torch.Tensor | None = None
        self._gather_spec: _Spec | None = None
        self._burst_end = False
        self._claim = _NO_CLAIM
        self._claim_args: tuple | None = None
        self._inline_result: Any = None
        self._stage_token = 1
        self._t_start = time.monotonic()
        self.stats: dict[str, int] = collections.Counter()
        self._autotuner = _Autotuner(self) if self.config.autotune else None
        self._thread = threading.Thread(target=self._main, name=f"hora-engine-{self.rank}", daemon=True)
        self._thread.start()

    # -- submission (any thread) ------------------------------------------------------------
    def submit(self, req: Request) -> Handle:
        """Enqueue ``req``; return its handle.

        Raises:
            CollectiveError: the engine has failed or shut down.
            ConfigError: a request with the same name is still in flight on this rank
                (a ValueError, as Horovod's).
        """
        req._engine = self
        if self.timeline.enabled:
            req.t_submit = self.timeline.now()
        with self._lock:
            if self._broken is not None:
                raise CollectiveError(f"the hora engine has stopped: {self._broken}") from self._broken
            if self._shutdown:
                raise CollectiveError("hora is shutting down; no new collectives are accepted")
            if req.name in self._names:
                raise ConfigError(
                    f"a collective named '{req.name}' is already in flight on rank {self.rank}; "
                    "wait for it (synchronize) before submitting the same name again"
                )
            self._names[req.name] = req
            self._incoming.append(req)
            missing = self._spec_missing
            if missing is not None:
                if req.name in missing:
                    missing.discard(req.name)
                    if not missing and self._claim == _NO_CLAIM:
                        self._claim = _OFFERED
                    stage = self._spec_stage
                    t = req.tensor
                    if stage is not None and t is not None and t.numel() >= STAGE_MIN_NUMEL:
                        # copy it into its place in the fusion buffer now, while it is hot in
                        # the cache (and while backward still runs), not after the last one;
                        # small tensors are cheaper in the engine's one batched copy
                        off, cnt = self._gather_spec.offsets[req.name]
                        if t.dtype == stage.dtype and t.numel() == cnt and t.is_cpu:
                            stage[off : off + cnt].copy_(_flat(t))
                            req.staged = self._stage_token
                    if not missing:
                        self._gather_cond.notify()  # this rank now has the whole predicted round
                elif req.name not in self._gather_spec.name_set:
                    self._spec_foreign = True  # not predicted: negotiate it soon
                    self._gather_cond.notify()
            if self._idle and not self._woken:
                self._woken = True
                self._waker.signal(self._epoch)
        return req

    def poke(self) -> None:
        """Wake every rank's idle engine for one round (stall checks while callers wait)."""
        with self._lock:
            if self._idle and not self._woken:
                self._woken = True
                self._waker.signal(self._epoch)

    def request_flush(self, handle: Handle) -> None:
        """A caller is about to block on ``handle``: stop waiting for more submissions
        while it is pending (until :meth:`end_flush`). When the engine offers a predicted
        round (see :meth:`_gather_predicted`), the caller runs it here, in its own thread."""
        with self._lock:
            self._blocked.append(handle)
            if self._claim != _OFFERED:
                if self._gathering:
                    self._gather_cond.notify()
                return
            self._claim = _CLAIMED
            args = self._claim_args
            self.stats["rounds_run_by_caller"] += 1
        try:
            with torch.no_grad():
                result: Any = self._round_body(*args)
        except BaseException as exc:  # noqa: BLE001 - the engine thread raises it
            result = exc
        with self._lock:
            self._inline_result = result
            self._claim = _RAN
            self._gather_cond.notify_all()

    def end_burst(self) -> None:
        """The caller has submitted a complete group (a bucket of gradients): negotiate
        what is gathered now instead of waiting for the burst to settle."""
        with self._lock:
            self._burst_end = True
            if self._gathering:
                self._gather_cond.notify()

    def end_flush(self, handle: Handle) -> None:
        """The caller of :meth:`request_flush` stopped blocking."""
        with self._lock:
            self._blocked.remove(handle)

    @property
    def _flush(self) -> bool:
        """(Under the lock.) Whether a caller is blocked on a handle that is not done."""
        return any(not h._done for h in self._blocked)

    def room_elements(self) -> int:
        """Spare elements a tensor's ``room`` needs after it: the largest control tail, and
        one "holds it" count per rank (see :meth:`_spec_collective`)."""
        return self._tail_size() + self.size

    def supports_device(self, device: str) -> bool:
        """Whether tensors on ``device`` ("cpu", "cuda") can be communicated."""
        return device in self.device_backends or device in self._device_factories

    def _backend_for(self, device: str) -> Backend:
        be = self.device_backends.get(device)
        if be is None:
            factory = self._device_factories.get(device)
            if factory is None:
                raise CollectiveError(f"no backend for tensors on {device!r} on rank {self.rank}")
            be = self.device_backends[device] = factory()  # every rank reaches this in the same order
            self.process_sets[0].device_groups[device] = be.world
        return be

    def _group_for(self, ps: ProcessSetInfo, device: str) -> Group:
        g = ps.device_groups.get(device)
        if g is None:
            be = self._backend_for(device)
            g = ps.device_groups.get(device)
            if g is None:
                g = ps.device_groups[device] = be.new_group(ps.ranks, ps.id)
        return g

    def describe_waiting(self, name: str) -> str:
        """Best-effort text naming the ranks that have (not) submitted ``name``."""
        p = self._table.get(name)
        if p is None:
            return ""
        ps = self.process_sets.get(next(iter(p.keys.values()))[6]) if p.keys else None
        members = ps.ranks if ps else list(range(self.size))
        missing = [r for r in members if r not in p.keys]
        return f": submitted by ranks {sorted(p.keys)}, never by ranks {missing}"

    def engine_stats(self) -> dict[str, int]:
        s = dict(self.stats)
        s["cache_capacity"] = self.cache.capacity
        s["cache_size"] = len(self.cache.by_name)
        s["fusion_threshold"] = self.config.fusion_threshold
        s["cycle_time_us"] = int(self.config.cycle_time * 1e6)
        return s

    def shutdown(self) -> bool:
        """Stop the engine once this rank has nothing in flight and every rank has shut down.

        Shutdown is collective, like ``MPI_Finalize``: until every rank has called it, this
        rank's engine keeps taking part in rounds, so ranks still working (say, on a
        process set this rank is not in) are not cut off. The next round tells every rank
        that this one has shut down: from then on an op that needs this rank's part fails
        at once on the ranks that submitted it (this rank will never submit anything
        again), instead of waiting for it. This rank's own ops in flight still complete
        when the others submit them, and fail once every rank that has not has shut down.

        Waits up to ``HORA_SHUTDOWN_TIMEOUT`` seconds; then pending handles are failed
        with CollectiveError, the backend calls the thread may be blocked in are
        interrupted where the backend can (shared-memory sockets), and this rank leaves.

        Returns:
            True when the engine thread has ended, so its backend can be released now;
            False when it is still inside a backend call that cannot be interrupted (a
            Gloo collective, which returns at its timeout or once the peers leave): the
            thread then runs what :meth:`on_exit` registered itself when it ends.
        """
        with self._lock:
            self._shutdown = True
            if self._gathering:
                self._gather_cond.notify()
            self._wake_locked()
        self._thread.join(self.config.shutdown_timeout)
        if self._thread.is_alive():
            log.warning("rank %d: the hora engine did not stop within %gs (%s); leaving without the other ranks "
                        "(raise %s to wait longer)", self.rank, self.config.shutdown_timeout,
                        "collectives still in flight here" if self._names else "other ranks have not shut down",
                        ENV_SHUTDOWN_TIMEOUT)
            self._abort(CollectiveError(f"rank {self.rank}: hora was shut down with collectives in flight"))
            self._thread.join(ABORT_JOIN_TIMEOUT)
        self.timeline.close()
        ended = not self._thread.is_alive()
        if ended:
            self._waker.close()
        return ended

    def _wake_locked(self) -> None:
        """(Under the lock.) Get an idle engine thread to run a round (or, alone, to exit)."""
        if self._idle and not self._woken:
            self._woken = True
            try:
                if self.size == 1:
                    self._waker.wake_self(self._epoch)
                else:
                    self._waker.signal(self._epoch)
            except Exception as exc:  # the store's host is gone: the thread notices by itself
                log.debug("rank %d: cannot wake the engine: %s", self.rank, exc)

    def _abort(self, exc: CollectiveError) -> None:
        """Give up on the other ranks: fail every handle, make the thread leave at its next
        chance, and interrupt the backend call it may be blocked in."""
        with self._lock:
            self._aborted = True
            if self._broken is None:
                self._broken = exc  # no new submissions
            self._gather_cond.notify_all()
            self._woken = False
            self._wake_locked()
            reqs = list(self._names.values())
        # fail the handles, but leave the engine's tables to its thread (it may be using them)
        for r in reqs:
            if not r._done:
                r._error = exc
                r._done = True
        with self._done_cond:
            self._done_cond.notify_all()
        groups = [g for info in self.process_sets.values() for g in info.device_groups.values()]
        for be in list(self.device_backends.values()):
            try:
                be.interrupt([g for g in groups if g is not None])
            except Exception as err:  # best effort: the call ends at its timeout instead
                log.debug("rank %d: interrupting %s failed: %s", self.rank, be.name, err)

    def on_exit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the engine thread has ended (now, if it has): releasing the
        backend must wait until no thread can be inside one of its calls."""
        with self._exit_lock:
            if not self._exited:
                self._on_exit.append(fn)
                return
        fn()

    def release(self) -> None:
        """Release every group of every process set and every backend (call it once the
        thread has ended: see :meth:`on_exit`)."""
        for info in list(self.process_sets.values()):
            for dev, g in list(info.device_groups.items()):
                be = self.device_backends.get(dev, self.backend)
                if g is None or g is be.world:
                    continue  # the world group goes with its backend
                try:
                    be.destroy_group(g)
                except Exception as exc:
                    log.debug("rank %d: releasing process set %d on %s failed: %s", self.rank, info.id, dev, exc)
        self.process_sets.clear()
        for dev, be in list(self.device_backends.items()):
            try:
                be.shutdown()
            except Exception as exc:
                log.warning("rank %d: shutting down the %s backend failed: %s", self.rank, be.name, exc)
        self.device_backends.clear()
        self._fusion.clear()

    def unusable_reason(self) -> str | None:
        """Why this engine cannot run the job's collectives any more (it failed, this or
        another rank has shut down), or None while it can."""
        if self._broken is not None:
            return f"has stopped ({self._broken})"
        if self._shutdown:
            return "is shutting down"
        if self._quit:
            return f"lost rank(s) {sorted(self._quit)}, which have shut down"
        return None

    def set_timeline(self, timeline: Timeline) -> None:
        """Record into ``timeline`` from now on (``hora.native.start_timeline``); the one
        recorded so far is written and closed."""
        old, self.timeline = self.timeline, timeline
        old.close()

    # -- the thread -----------------------------------------------------------------------
    def _main(self) -> None:
        torch.set_grad_enabled(False)  # (thread-local) buffers are moved and summed, never differentiated
        try:
            while True:
                if not self._active_wait():
                    break
                while self._round():
                    pass
                if self._all_quit:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting handle
            if not isinstance(exc, CollectiveError):
                log.exception("rank %d: the hora engine failed", self.rank)
                exc = CollectiveError(f"rank {self.rank}: the hora engine failed: {exc!r}")
            self._fail_all(exc)
        finally:
            with self._exit_lock:
                self._exited = True
                callbacks, self._on_exit = self._on_exit, []
            for fn in callbacks:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - the thread is ending; say so and go on
                    log.exception("rank %d: releasing the hora engine failed", self.rank)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = exc
            reqs = list(self._names.values())
            self._names.clear()
            self._incoming.clear()
            self._waiting.clear()
        for r in reqs:
            h = r.handle
            if h is not None and not h._done:
                h._error = exc
                h._done = True
        with self._done_cond:
            self._done_cond.notify_all()

    def _active_wait(self) -> bool:
        """Block while the whole job is idle. False: shut down."""
        with self._lock:
            self._idle = True
            self._woken = False
            if self._aborted:
                return False
            if self._shutdown:
                if self.size == 1:
                    if not self._names:
                        return False
                elif not self._quit_sent or (not self._names and not self._quit_announced):
                    # a round tells every rank that this one has shut down; once it has
                    # nothing in flight, one more may be the round in which every rank
                    # is done (the engine keeps answering rounds until then)
                    self._quit_announced = not self._names
                    self._woken = True
                    self._waker.signal(self._epoch)
            if self._incoming and not self._woken:
                self._woken = True
                self._waker.signal(self._epoch)
        if self._to_forget and (not self._woken or len(self._to_forget) > 64):
            # this rank's wake-up keys of epochs it has left (one store call each): done
            # while nothing waits, so a burst of ops does not pay for them
            forget, self._to_forget = self._to_forget, []
            for e in forget:
                self._waker.forget(e)
        while True:
            try:
                woken = self._waker.wait(self._epoch, IDLE_POLL)
            except Exception as exc:
                with self._lock:
                    if self._shutdown:
                        return False
                raise CollectiveError(
                    f"rank {self.rank}: lost the job's coordination store while idle ({exc}); "
                    "did another rank exit or crash?"
                ) from None
            with self._lock:
                if self._aborted:
                    return False
                if woken:
                    self._idle = False
                    return True

    def _nonmember_slots(self) -> list[int]:
        """Cache slots of ops whose process set this rank is not a member of."""
        key = (self.cache.version, self._ps_version)
        if key != self._nm_key:
            self._nm_key = key
            pss = self.process_sets
            self._nm_slots = [e.slot for e in self.cache.by_name.values()
                              if e.ps_id and (e.ps_id not in pss or not pss[e.ps_id].group.is_member)]
        return self._nm_slots

    def _now_ms(self) -> int:
        return int((time.monotonic() - self._t_start) * 1000)

    def _round(self) -> bool:
        """One negotiation round (+ execution). Returns False when the job went idle."""
        if self._aborted:
            raise CollectiveError(f"rank {self.rank}: hora was shut down without the other ranks")
        t0 = time.perf_counter()
        tl0 = self.timeline.now() if self.timeline.enabled else 0.0
        self._round_no += 1
        self.stats["rounds"] += 1
        cycle = self.config.cycle_time
        spec = self._spec
        with self._lock:
            if spec is not None:
                if self._gather_predicted(spec, t0, tl0):
                    # a caller that blocked on a handle ran this round in its own thread
                    result, self._inline_result = self._inline_result, None
                    if isinstance(result, BaseException):
                        raise result
                    return bool(result)
            elif self._incoming and not self._flush and not self._burst_end and cycle > 0:
                # let a burst of submissions (a backward pass, a loop of allreduce_async)
                # land before negotiating, instead of competing with it for the GIL
                self._gathering = True
                deadline = time.monotonic() + 10 * cycle
                seen = len(self._incoming)
                while not self._flush and not self._shutdown and not self._burst_end:
                    self._gather_cond.wait(cycle)
                    n = len(self._incoming)
                    if n == seen or time.monotonic() >= deadline:
                        break
                    seen = n
                self._gathering = False
        return self._round_body(t0, tl0, spec)

    def _round_body(self, t0: float, tl0: float, spec: _Spec | None) -> bool:
        """The round after its gather: negotiate, execute, decide what comes next."""
        if self._aborted:
            raise CollectiveError(f"rank {self.rank}: hora was shut down without the other ranks")
        cache = self.cache
        C = cache.capacity
        with self._lock:
            self._burst_end = False
            fresh, self._incoming = self._incoming, []
        waiting = self._waiting
        by_name = cache.by_name
        me = self.rank
        bits: list[int] = []
        uncached: list[tuple] = []
        slots = cache.slots
        rest = list(waiting.values())  # still pending from earlier rounds: re-check their slots
        for req in fresh:
            waiting[req.name] = req
            if C:
                e = by_name.get(req.name)
                if e is not None and e.key == req.key and e.locals.get(me) == req.local:
                    req.entry = e
                    bits.append(e.slot)
                    continue
            rest.append(req)
        for req in rest:
            e = req.entry
            if e is not None:
                if slots[e.slot] is e:
                    bits.append(e.slot)
                    continue
                req.entry = None
            if not req.reported:
                req.reported = True
                uncached.append((req.name, req.key, req.local))
                if req.kind == JOIN:
                    self._my_join_round = self._round_no
        if self._shutdown and not self._quit_sent:
            self._quit_sent = True  # from now on nothing new comes from this rank: say so
            uncached.append((f"{QUIT}.{me}", _QUIT_KEY, None))
        if self._my_join_round is not None and self._my_join_round < self._round_no and C:
            # a joined rank stands in (with zeros) for every cached allreduce of its sets
            for e in cache.by_name.values():
                ps = self.process_sets.get(e.ps_id)
                if e.kind == ALLREDUCE and ps is not None and self.rank in ps.ranks:
                    bits.append(e.slot)
        payload = pickle.dumps(uncached, protocol=pickle.HIGHEST_PROTOCOL) if uncached else b""
        ctrl = np.zeros(2 * C + 7, dtype=np.int32)
        ctrl[C : 2 * C] = 1
        if bits:
            ctrl[bits] = 1
            ctrl[C : 2 * C] = 1 - ctrl[:C]
        if C:
            nm = self._nonmember_slots()
            if nm:
                # a rank outside a cached op's process set stands for "ready" (MIN) and
                # "has not submitted" (inverted), so readiness is decided by the members
                ctrl[nm] = 1
        ctrl[2 * C] = 0 if uncached else 1
        ctrl[2 * C + 1] = -len(payload)
        ctrl[2 * C + 2] = 0 if (self._waiting or uncached) else 1
        ctrl[2 * C + 3] = -self._now_ms()
        tuner = self._autotuner
        ctrl[2 * C + 4] = tuner.index if (tuner is not None and self.rank == 0) else _I32_MAX
        ctrl[2 * C + 5] = 1 if (self._shutdown and not self._names) else 0
        ctrl[2 * C + 6] = 1 if (self.config.speculate and tuner is None) else 0
        spec_ok = False
        if spec is not None and spec.piggyback:
            outcome = self._spec_collective(spec, ctrl, bits)
            if outcome == _PURE_HIT:
                return self._end_pure_round(t0, tl0, spec)
            spec_ok = outcome == _HIT
        else:
            self.backend.allreduce(torch.from_numpy(ctrl), ReduceOp.Min, self.backend.world)
        self._spec_allowed = ctrl[2 * C + 6] == 1
        if tuner is not None:
            tuner.apply(int(ctrl[2 * C + 4]))  # rank 0's choice, so grouping agrees everywhere
        any_work = ctrl[2 * C + 2] == 0
        if ctrl[2 * C + 5] == 1:
            self._all_quit = True  # every rank has shut down with nothing in flight
            return False
        if not any_work:
            self._spec = None  # (a predicted round nobody had anything for)
            return self._after_round(t0, False, False)
        evictions = cache.evictions
        now = int(-ctrl[2 * C + 3])
        ready_entries = [slots[s] for s in np.flatnonzero(ctrl[:C] == 1).tolist()] if C else []
        partial = np.flatnonzero((ctrl[C : 2 * C] == 0) & (ctrl[:C] == 0)) if C else ()

        errors: dict[str, str] = {}
        new_ready: list[_Response] = []
        if ctrl[2 * C] == 0:
            maxlen = int(-ctrl[2 * C + 1])
            metas = self._exchange(payload, maxlen)
            self._process_metas(metas, now, new_ready, errors)
        self._check_stalls(now, partial, errors)

        responses: list[_Response] = [e for e in ready_entries if e is not None]
        touch = cache.lru.move_to_end
        for e in responses:
            touch(e.slot)
        self.stats["cache_hits"] += len(responses)
        plan_key = ctrl[:C].tobytes()
        round_bits = plan_key
        if spec_ok:
            # the predicted responses were reduced by the negotiation's own collective
            done = spec.slot_set
            responses = [e for e in responses if e.slot not in done]
            if responses:
                rest = ctrl[:C].copy()
                rest[spec.slots] = 0
                plan_key = rest.tobytes()
        new_ready.sort(key=lambda r: r.seq)
        responses.extend(new_ready)
        self.stats["cache_misses"] += sum(1 for r in new_ready if r.error is None and r.kind not in _UNCACHEABLE)
        if self.timeline.enabled:
            self.timeline.cycle(tl0, self.timeline.now(), round=self._round_no, responses=len(responses))

        for name, msg in errors.items():
            req = self._waiting.pop(name, None)
            if req is not None:
                self._finish(req, error=CollectiveError(msg))
        try:
            if responses and not new_ready and not self.timeline.enabled and not self._joined:
                # steady state: only cached responses; reuse the execution plan of the
                # last round with exactly these bits
                self._execute_planned(plan_key, responses)
            elif responses:
                self._execute(responses)
                if C:
                    for r in new_ready:
                        if r.error is None and r.kind not in _UNCACHEABLE:
                            cache.put(r.name, r.key, r.locals)
        finally:
            self._notify_done()
        if tuner is not None and self.rank == 0:
            tuner.observe(responses)
        if new_ready or errors:
            self._learn(None)
        elif responses or spec_ok:
            self._learn(round_bits)
        elif spec is not None:
            self._spec = None  # predicted, and nothing came: wait through the store again
        return self._after_round(t0, bool(responses or errors), cache.evictions != evictions)

    # -- speculation ----------------------------------------------------------------------
    # Steady-state training repeats the same rounds: every step the same gradients become
    # ready together. Every rank records, alike, which round (its cached-response bits)
    # followed which; once a successor has repeated SPEC_MIN_HITS times, the next round is
    # *predicted*. A predicted round that is one fused float32/float64 Sum/Average
    # allreduce of the global set runs as ONE collective: each rank waits until it holds
    # every predicted tensor (or a caller blocks, or it shuts down), packs them into the
    # fusion buffer and appends its control vector, encoded as counts, and one Sum
    # allreduce reduces data and negotiation together. When every rank held the whole
    # prediction (a count in the control part says so), the data part is the result;
    # otherwise it is discarded and the round continues as a normal one, from the decoded
    # control vector. Either way nothing else changes: the same responses, errors, stall
    # checks and cache updates follow on every rank. A lone tensor with spare room after
    # it is reduced in place instead (ranks without it send zeros); after a miss the ranks
    # that held it keep the partial sum on the lowest of them and zeros on the others, so
    # nothing is lost. Any other predicted round is only waited for locally, then
    # negotiated as a normal round. When every rank had nothing but the prediction (one
    # more count in the tail), a hit ends the round at once (Engine._end_pure_round).
    SPEC_MIN_HITS = 2

    def _gather_predicted(self, spec: _Spec, t0: float, tl0: float) -> bool:
        """(Under the lock.) Wait until this rank has submitted every tensor of the
        predicted round, a caller blocks on a handle, or shutdown. True: a caller ran the
        round in its own thread.

        Once this rank holds the whole prediction the round is *offered*: a caller that
        blocks on a handle (``request_flush``) runs it in its thread, as DDP's hooks
        launch their reductions, sparing two hand-overs between threads. Nobody claims
        it within one cycle: this thread runs it (and after two such rounds in a row it
        stops offering that round, trying again every 16th time).
        """
        if self._flush or self._shutdown:
            return False
        names = self._names
        missing = {n for n in spec.names if n not in names}
        self._claim_args = (t0, tl0, spec)
        self._claim = _NO_CLAIM if missing else _OFFERED
        self._spec_missing = missing
        self._gather_spec = spec
        if missing and spec.piggyback and not spec.inplace:
            self._spec_stage = self._fusion_buffer(spec.dtype, spec.numel + self._tail_size(),
                                                   torch.device("cpu"))[: spec.numel]
        self._spec_foreign = any(r.name not in spec.name_set for r in self._incoming)
        self._gathering = True
        # a rank may never submit the predicted tensors (its program went elsewhere): the
        # round then starts after the stall poll interval, so stall checks still run
        deadline = time.monotonic() + (self.config.stall_poll or IDLE_POLL)
        settle = 10 * self.config.cycle_time
        cond = self._gather_cond
        try:
            while missing and not self._flush and not self._shutdown and self._claim == _NO_CLAIM:
                now = time.monotonic()
                if self._spec_foreign:  # something unpredicted is pending: gather it briefly, go
                    deadline = min(deadline, now + settle)
                    self._spec_foreign = False
                left = deadline - now
                if left <= 0:
                    break
                cond.wait(left)
            if self._claim == _OFFERED and not self._shutdown and spec.should_offer():
                grace = time.monotonic() + self.config.cycle_time
                while self._claim == _OFFERED and not self._shutdown:
                    left = grace - time.monotonic()
                    if left <= 0:
                        # nobody blocked on it in time (say, the first bucket of a backward pass)
                        spec.unclaimed += 1
                        break
                    cond.wait(left)
            while self._claim == _CLAIMED:
                cond.wait(1.0)
            if self._claim == _RAN:
                spec.unclaimed = 0
                return True
            return False
        finally:
            self._claim = _NO_CLAIM
            self._claim_args = None
            self._spec_missing = None
            self._gather_spec = None
            self._spec_stage = None
            self._gathering = False

    def _spec_collective(self, spec: _Spec, ctrl: np.ndarray, bits: list[int]) -> int:
        """Run the predicted round's data and the control vector ``ctrl`` (MIN form) as one
        Sum allreduce; rewrite ``ctrl`` with the job-wide (MIN form) result. _HIT when the
        prediction held on every rank (its requests are then finished), _MISS when not;
        _PURE_HIT when it held and nothing else happened anywhere (``ctrl`` is then left
        as it was: :meth:`_end_pure_round` ends the round)."""
        C = self.cache.capacity
        size = self.size
        n = spec.numel
        have_bits = set(bits)
        have = all(s in have_bits for s in spec.slots)
        # only the slots up to the highest one in use travel (the cache, so this bound, is
        # the same on every rank); a slot beyond it has no entry: nobody votes for it
        U = self._slots_in_use()
        F = 2 * U  # where the flags start
        inplace = spec.inplace
        tail = np.zeros(F + 8 + (size if inplace else 0),
                        dtype=np.float64 if spec.dtype == torch.float64 else np.float32)
        tail[:U] = ctrl[:U]  # ready votes (members that have it, and non-members)
        tail[U:F] = 1 - ctrl[C : C + U]  # members that have it
        tail[F] = 1 - ctrl[2 * C]  # ranks with uncached requests
        tail[F + 1] = -(-int(-ctrl[2 * C + 1]) // 1024)  # payload KiB, rounded up
        tail[F + 2] = 1 - ctrl[2 * C + 2]  # ranks with work
        # rank 0's clock, in ms (exact in float32 for 4.6 hours, then to a few ms)
        tail[F + 3] = -ctrl[2 * C + 3] if self.rank == 0 else 0
        tail[F + 4] = ctrl[2 * C + 5]  # ranks done (shutdown)
        tail[F + 5] = ctrl[2 * C + 6]  # ranks that allow speculation
        tail[F + 6] = 1 if have else 0  # ranks that hold the whole prediction
        # ranks with nothing but the prediction: no other op (so none ready or half-submitted
        # anywhere once every rank says so), nothing uncached, not done, speculation on, and
        # no stall tracking going on (job-wide state)
        alone = (have and len(have_bits) == len(spec.slots) and ctrl[2 * C] == 1 and ctrl[2 * C + 5] == 0
                 and ctrl[2 * C + 6] == 1 and not self._table and not self._slot_partial_since)
        tail[F + 7] = 1 if alone else 0
        reqs: list[Request] = []
        if have:
            waiting = self._waiting
            reqs = [waiting[name] for name in spec.names]
        if inplace:
            # the tensor itself, the tail in its room; a rank without it sends zeros
            if have:
                tail[F + 8 + self.rank] = 1  # which ranks hold it
                buf = reqs[0].room[: n + tail.size]
            else:
                buf = self._fusion_buffer(spec.dtype, n + tail.size, torch.device("cpu"))
                buf[:n].zero_()
            data = buf[:n]
        else:
            buf = self._fusion_buffer(spec.dtype, n + tail.size, torch.device("cpu"))
            data = buf[:n]
            token = self._stage_token
            self._stage_token += 1  # what was staged is consumed (or overwritten) by this collective
            if have:
                parts = spec.parts_of(data)
                todo = [i for i, q in enumerate(reqs) if q.staged != token]
                if len(todo) == len(reqs):
                    torch.cat([_flat(q.tensor) for q in reqs], out=data)  # one batched copy
                elif todo:
                    torch._foreach_copy_([parts[i] for i in todo], [_flat(reqs[i].tensor) for i in todo])
                if spec.prescale != 1.0:
                    _scale_(data, spec.prescale)
        buf[n:].copy_(torch.from_numpy(tail))
        out = buf[n:].numpy()  # (made before the collective: the less runs after it, the better)
        self.backend.allreduce(buf, ReduceOp.Sum, self.backend.world)
        st = self.stats
        # float32 or float64: the counts are exact in either
        pure = out[F + 7] == size  # the prediction held and nothing else happened anywhere
        held = pure or round(out[F + 6]) == size
        if not pure:
            self._decode_tail(out, ctrl, U, F)
        if not held:
            st["speculation_misses"] += 1
            if inplace and have:
                # Some rank did not have the tensor yet: this rank's tensor now holds the sum
                # over the ranks that had it (the others sent zeros). The lowest of those
                # ranks keeps that sum, the others zero their tensor, so the tensors of all
                # ranks still add up to the true sum, which the normal round that reduces
                # the tensor later (in place, prescale 1) produces.
                holders = np.flatnonzero(out[F + 8 : F + 8 + size] > 0.5)
                if self.rank != int(holders[0]):
                    data.zero_()
            return _MISS
        post = spec.postscale / size if spec.average else spec.postscale
        if inplace:
            if post != 1.0:
                _scale_(data, post)
        elif post == 1.0:  # (``parts``: set above, as have)
            torch._foreach_copy_([_flat(q.output) for q in reqs], parts)
        elif len(reqs) <= 64:  # scale while copying out: one pass over the data, not two
            mul = torch.mul
            for q, part in zip(reqs, parts):
                mul(part, post, out=_flat(q.output))
        else:
            _scale_(data, post)
            torch._foreach_copy_([_flat(q.output) for q in reqs], parts)
        pop = self._waiting.pop
        for q in reqs:
            pop(q.name, None)
        self._finish_fused(reqs, n * buf.element_size(), fused=not inplace)
        st["speculation_hits"] += 1
        return _PURE_HIT if pure else _HIT

    def _decode_tail(self, out: np.ndarray, ctrl: np.ndarray, U: int, F: int) -> None:
        """Rewrite ``ctrl`` (MIN form) from a predicted round's reduced tail ``out``."""
        C = self.cache.capacity
        size = self.size
        np.equal(out[:U], size, out=ctrl[:U], casting="unsafe")
        ctrl[U:C] = 0
        np.equal(out[U:F], 0, out=ctrl[C : C + U], casting="unsafe")
        ctrl[C + U : 2 * C] = 1
        ctrl[2 * C] = 0 if out[F] > 0 else 1
        ctrl[2 * C + 1] = -int(round(out[F + 1])) * 1024
        ctrl[2 * C + 2] = 0 if out[F + 2] > 0 else 1
        ctrl[2 * C + 3] = -int(round(out[F + 3]))
        ctrl[2 * C + 4] = _I32_MAX
        ctrl[2 * C + 5] = 1 if round(out[F + 4]) == size else 0
        ctrl[2 * C + 6] = 1 if round(out[F + 5]) == size else 0

    def _end_pure_round(self, t0: float, tl0: float, spec: _Spec) -> bool:
        """The rest of a round whose prediction held with nothing else anywhere: exactly
        what the general path does for it (the cache's LRU order, stats, waking callers,
        learning), without decoding the control vector."""
        self._spec_allowed = True
        touch = self.cache.lru.move_to_end
        for slot in spec.slots:
            touch(slot)
        st = self.stats
        st["cache_hits"] += len(spec.slots)
        st["speculation_alone"] += 1
        if self.timeline.enabled:
            self.timeline.cycle(tl0, self.timeline.now(), round=self._round_no, responses=len(spec.slots))
        self._notify_done()
        self._learn(spec.bits)
        return self._after_round(t0, True, False)

    def _tail_size(self) -> int:
        """Elements of the control vector at the end of a predicted round's buffer, at most."""
        return 2 * self.cache.capacity + 8

    def _slots_in_use(self) -> int:
        """One past the highest cache slot in use (identical on every rank)."""
        key = (self.cache.version, "used")
        if self._used_key != key:
            self._used_key = key
            self._used = max((e.slot for e in self.cache.by_name.values()), default=-1) + 1
        return self._used

    def _learn(self, bits: bytes | None) -> None:
        """Record that a round with cached-response ``bits`` followed the previous one
        (None: a round that negotiated by name; the chain starts over) and predict the
        next round. Runs alike on every rank, from job-wide results only."""
        self._spec = None
        if bits is None:
            self._prev_bits = None
            return
        prev = self._prev_bits
        if prev is not None:
            succ = self._succ.get(prev)
            if succ is not None and succ[0] == bits:
                succ[1] += 1
            else:
                if len(self._succ) >= 256:
                    self._succ.clear()
                self._succ[prev] = [bits, 1]
        self._prev_bits = bits
        nxt = self._succ.get(bits)
        if nxt is None or nxt[1] < self.SPEC_MIN_HITS or not self._spec_allowed or self._joined:
            return
        version = (nxt[0], self.cache.version, self._ps_version, self.config.fusion_threshold)
        memo = self._spec_memo
        if version in memo:
            self._spec = memo[version]
        else:
            if len(memo) >= 64:
                memo.clear()
            self._spec = memo[version] = self._make_spec(nxt[0])

    def _make_spec(self, bits: bytes) -> _Spec | None:
        """The prediction for a round with ``bits``. When the round is one fused
        float32/float64 Sum/Average allreduce of the global set on the CPU, it runs as one
        collective (``piggyback``); any other predicted round is only waited for locally
        (no wake-up through the store) and then negotiated and run as a normal round."""
        C = self.cache.capacity
        slots = np.flatnonzero(np.frombuffer(bits, dtype=np.int32)[:C]).tolist()
        entries = [self.cache.slots[s] for s in slots]
        if not entries or None in entries:
            return None
        names = [e.name for e in entries]
        local = _Spec(slots, names, [0] * len(names), None, 1.0, 1.0, False, piggyback=False, bits=bits)
        units = self._plan(entries)
        if len(units) != 1 or type(units[0]) is not _FusedGroup or len(units[0].resps) != len(entries):
            return local
        key = entries[0].key
        # key: kind, dtype, shape, ndim, op, root, ps, prescale, postscale, compression, device, extra
        if (key[0] != ALLREDUCE or key[1] not in ("float32", "float64") or key[6] != 0 or key[9] != "none"
                or key[10] != "cpu" or ReduceOp(key[4]) not in (ReduceOp.Sum, ReduceOp.Average)):
            return local
        unit = units[0]
        if len(unit.names) == 1 and key[11] == ROOM and key[7] == 1.0:
            # a lone tensor with spare room after it: reduced in place, the control vector in
            # the room (see _spec_collective for why a miss loses nothing)
            return _Spec(slots, unit.names, unit.sizes, getattr(torch, key[1]), key[7], key[8],
                         ReduceOp(key[4]) == ReduceOp.Average, inplace=True, bits=bits)
        if len(unit.names) == 1 and unit.nbytes > SPEC_SINGLE_MAX_BYTES:
            # a lone tensor is reduced in place by a normal round; riding along with the
            # negotiation would copy it in and out of the fusion buffer, which costs more
            # than the negotiation's own small collective
            return local
        return _Spec(slots, unit.names, unit.sizes, getattr(torch, key[1]), key[7], key[8],
                     ReduceOp(key[4]) == ReduceOp.Average, bits=bits)

    def _after_round(self, t0: float, progressed: bool, evicted: bool) -> bool:
        """Decide, identically on every rank, whether another round follows (True) or the
        job goes idle until the next submission anywhere (False).

        Every input is job-wide: the round's results, cache evictions (requests whose
        slot was dropped must be renegotiated by name in a next round), joined ranks
        (they stand in for cached allreduces from the round after their join on) and the
        count of rounds without results (``HORA_LINGER_ROUNDS``). Pending work needs no
        polling: a rank that submits wakes the job, and a caller blocked on a handle wakes
        it every :attr:`EngineConfig.stall_poll` seconds for the stall checks.
        """
        self._quiet_rounds = 0 if progressed else self._quiet_rounds + 1
        if not evicted and not self._joined and self._quiet_rounds >= self.config.linger_rounds:
            self._quiet_rounds = 0
            if self._spec is not None:
                # every rank knows what comes next: each waits for its own part of it in
                # the next round's gather, with no wake-up through the store
                return True
            self._go_idle()
            return False
        left = self.config.cycle_time - (time.perf_counter() - t0)
        if left > 0:
            with self._lock:
                if not self._incoming and not self._flush:
                    self._gathering = True
                    self._gather_cond.wait(left)  # a caller blocking on a handle ends it early
                    self._gathering = False
        return True

    def _go_idle(self) -> None:
        self._to_forget.append(self._epoch)  # this rank's key, deleted while idle
        self._epoch += 1

    def _exchange(self, payload: bytes, maxlen: int) -> list[list[tuple]]:
        width = maxlen + 4
        buf = np.zeros(width, dtype=np.uint8)
        buf[:4] = np.frombuffer(struct.pack("!I", len(payload)), dtype=np.uint8)
        if payload:
            buf[4 : 4 + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        out = torch.empty(width * self.size, dtype=torch.uint8)
        self.backend.allgather(out, torch.from_numpy(buf), self.backend.world)
        raw = out.numpy().tobytes()
        metas = []
        for r in range(self.size):
            chunk = raw[r * width : (r + 1) * width]
            (n,) = struct.unpack("!I", chunk[:4])
            metas.append(pickle.loads(chunk[4 : 4 + n]) if n else [])
        self.stats["negotiation_bytes"] += width * self.size
        return metas

    def _members(self, key: tuple) -> list[int]:
        ps = self.process_sets.get(key[6])
        return ps.ranks if ps is not None else []

    def _process_metas(self, metas: list[list[tuple]], now: int, ready: list[_Response],
                       errors: dict[str, str]) -> None:
        touched: dict[str, _Pending] = {}
        joined_changed = False
        quit_before = len(self._quit)
        table = self._table
        for r, lst in enumerate(metas):
            for name, key, local in lst:
                if key[0] == QUIT:
                    self._quit.add(r)
                    continue
                if self.cache.capacity:
                    self.cache.erase(name)
                poison = self._poisoned.get(name)
                if poison is not None:
                    if r == self.rank:
                        errors[name] = poison[0]
                    poison[1].discard(r)
                    if not poison[1]:
                        del self._poisoned[name]
                    continue
                p = table.get(name)
                if p is None:
                    self._seq += 1
                    p = table[name] = _Pending(name, self._seq, now)
                p.keys[r] = key
                p.locals[r] = local
                p.rounds[r] = self._round_no
                touched[name] = p
                if key[0] == JOIN:
                    self._joined[r] = self._round_no
                    joined_changed = True
        if len(self._quit) != quit_before:
            # cached ops that need a rank that shut down would never become ready: drop
            # them, so that their requests are negotiated by name and fail at once
            for e in list(self.cache.by_name.values()):
                if not self._quit.isdisjoint(self._members(e.key) or range(self.size)):
                    self.cache.erase(e.name)
            self._learn(None)
        if joined_changed or len(self._quit) != quit_before:
            for p in table.values():
                touched.setdefault(p.name, p)
        for p in sorted(touched.values(), key=lambda x: x.seq):
            self._check_complete(p, ready, errors)

    def _check_complete(self, p: _Pending, ready: list[_Response], errors: dict[str, str]) -> None:
        keys = p.keys
        first = next(iter(keys.values()))
        if any(k != first for k in keys.values()):
            # wait until every rank that should take part has spoken, so the error names
            # them all and reaches every one of them in the same round
            members: set[int] = set()
            for k in keys.values():
                members.update(self._members(k) or range(self.size))
            present = set(keys) | self._quit  # (a rank that shut down never speaks again)
            if all(k[0] == ALLREDUCE for k in keys.values()):
                present |= set(self._joined)
            if not members <= present:
                return
            msg = _mismatch_message(p.name, keys)
            del self._table[p.name]
            if self.rank in keys:
                errors[p.name] = msg
            return
        kind = first[0]
        ps = self.process_sets.get(first[6])
        if self._quit or self._joined:
            msg = self._cannot_complete(p.name, kind, ps, keys)
            if msg is not None:
                del self._table[p.name]
                if self.rank in keys:
                    errors[p.name] = msg
                return
        if ps is not None and kind != JOIN and len(keys) == len(ps.ranks) and not self._joined:
            # every member has submitted the same thing (non-members cannot submit)
            del self._table[p.name]
            ready.append(_Response(p.name, first, p.locals, seq=p.seq))
            return
        if ps is None:
            del self._table[p.name]
            msg = f"{kind} '{p.name}' names process set {first[6]}, which is not registered (ranks {sorted(keys)})"
            if self.rank in keys:
                errors[p.name] = msg
            return
        members = self._members(first)
        present = set(keys)
        if kind == ALLREDUCE:
            present |= set(self._joined)
        if kind == JOIN:
            present = set(self._joined)
        if not all(m in present for m in members):
            return
        del self._table[p.name]
        locals_ = {r: p.locals.get(r) for r in members}
        extra = None
        if kind == JOIN:
            extra = max(self._joined, key=lambda r: (self._joined[r], r))
            self._joined.clear()
            self._my_join_round = None
        ready.append(_Response(p.name, first, locals_, seq=p.seq, extra_result=extra))

    def _cannot_complete(self, name: str, kind: str, ps: ProcessSetInfo | None, keys: dict[int, tuple]) -> str | None:
        """Why the pending op ``name`` can never complete, or None: a member that has not
        submitted it has shut down, or has joined and the op is not an allreduce (only
        allreduces go on with joined ranks, which contribute zeros)."""
        members = ps.ranks if ps is not None else list(range(self.size))
        if kind == JOIN:
            absent = [m for m in members if m not in self._joined]
        else:
            absent = [m for m in members if m not in keys and not (kind == ALLREDUCE and m in self._joined)]
        gone = [m for m in absent if m in self._quit]
        if gone:
            return (f"{kind} '{name}' cannot complete: rank(s) {gone} shut down without submitting it "
                    f"(submitted by ranks {sorted(keys)})")
        joined = [m for m in absent if m in self._joined and kind not in (JOIN, ALLREDUCE)]
        if joined:
            return (f"{kind} '{name}' cannot run while rank(s) {joined} have joined (hora.join): only allreduce "
                    "goes on with joined ranks; submit it on every rank before they join")
        return None

    def _check_stalls(self, now: int, partial: Any, errors: dict[str, str]) -> None:
        check = self.config.stall_check_time
        if check <= 0:
            return
        shutdown_after = self.config.stall_shutdown_time
        # cached requests stuck half-submitted: drop their slot so they are renegotiated
        # by name (which tells exactly who is missing)
        seen = set()
        for s in partial:
            s = int(s)
            seen.add(s)
            since = self._slot_partial_since.setdefault(s, now)
            if now - since > check * 500:  # half the check time, in ms
                e = self.cache.slots[s]
                if e is not None:
                    self.cache.erase(e.name)
                self._slot_partial_since.pop(s, None)
        for s in list(self._slot_partial_since):
            if s not in seen:
                del self._slot_partial_since[s]
        for p in list(self._table.values()):
            age = (now - p.first) / 1000.0
            if age <= check:
                continue
            first = next(iter(p.keys.values()))
            members = self._members(first) or list(range(self.size))
            missing = [m for m in members if m not in p.keys and not (first[0] == ALLREDUCE and m in self._joined)]
            if not p.warned:
                p.warned = True
                log.warning(
                    "stall: %s '%s' was submitted by ranks %s but not by ranks %s for %.1fs "
                    "(HORA_STALL_CHECK_TIME=%g)", first[0], p.name, sorted(p.keys), missing, age, check,
                )
                self.stats["stall_warnings"] += 1
            if shutdown_after > 0 and age > shutdown_after:
                msg = (f"stalled collective: {first[0]} '{p.name}' was submitted by ranks {sorted(p.keys)} but "
                       f"ranks {missing} never submitted it within HORA_STALL_SHUTDOWN_TIME={shutdown_after:g}s")
                del self._table[p.name]
                if self.rank in p.keys:
                    errors[p.name] = msg
                if missing:
                    self._poisoned[p.name] = (msg, set(missing))

    # -- execution ------------------------------------------------------------------------
    def _finish(self, req: Request, result: Any = None, error: BaseException | None = None) -> None:
        """Complete ``req``'s handle; callers are woken by :meth:`_notify_done`."""
        h = req.handle
        if h is None:
            return
        if error is not None:
            h._error = error
        else:
            h._result = result
        self._completed.append(h)

    def _notify_done(self) -> None:
        done, self._completed = self._completed, []
        if not done:
            return
        names = self._names
        with self._lock:
            for h in done:
                names.pop(h.name, None)
        for h in done:
            h._done = True
        with self._done_cond:
            self._done_cond.notify_all()

    def _execute(self, responses: list[_Response]) -> None:
        threshold = self.config.fusion_threshold
        units: list[Any] = []
        open_groups: dict[tuple, _FusedGroup] = {}
        pss = self.process_sets
        pop = self._waiting.pop
        tl = self.timeline
        for resp in responses:
            kind = resp.kind
            if kind in (PS_ADD, PS_REMOVE):
                ps = None
            else:
                ps = pss.get(resp.ps_id)
                if ps is None or not ps.group.is_member:
                    continue  # not a member of this process set: nothing to do here
            req = pop(resp.name, None)
            if tl.enabled and req is not None:
                req.t_ready = tl.now()
                tl.span(resp.name, "NEGOTIATE", req.t_submit, req.t_ready)
            if kind == ALLREDUCE:
                _fuse_into(units, open_groups, threshold, resp, ps).reqs.append(req)
            else:
                units.append((resp, req, ps))
        for unit in units:
            if type(unit) is _FusedGroup:
                self._run_allreduce(unit.resps, unit.reqs, unit.ps)
            else:
                self._run_single_and_finish(*unit)

    def _run_single_and_finish(self, resp: _Response, req: Request | None, ps: ProcessSetInfo | None) -> None:
        """Run one unfused response and complete its request (a backend failure fails only that request)."""
        try:
            result = self._run_single(resp, req, ps)
        except CollectiveError:
            raise
        except Exception as exc:
            if req is not None:
                self._finish(req, error=CollectiveError(f"{resp.kind} '{resp.name}' failed: {exc}"))
            return
        if req is not None:
            self._finish(req, result=result)

    def _plan(self, responses: list[_Response]) -> list[Any]:
        """Group ``responses`` into execution units, as :meth:`_execute` would."""
        threshold = self.config.fusion_threshold
        units: list[Any] = []
        open_groups: dict[tuple, _FusedGroup] = {}
        pss = self.process_sets
        for resp in responses:
            ps = pss.get(resp.ps_id)
            if ps is None or not ps.group.is_member:
                continue
            if resp.kind == ALLREDUCE:
                _fuse_into(units, open_groups, threshold, resp, ps)
            else:
                units.append((resp, None, ps))
        for u in units:
            if type(u) is _FusedGroup:
                u.names = [r.name for r in u.resps]
                u.sizes = [r.numel for r in u.resps]
                u.flat = all(r.key[3] == 1 for r in u.resps)
        return units

    def _execute_planned(self, bits: bytes, responses: list[_Response]) -> None:
        version = (self.cache.version, self._ps_version, self.config.fusion_threshold)
        cached = self._plans.get(bits)
        if cached is None or cached[0] != version:
            if len(self._plans) > 64:
                self._plans.clear()
            cached = self._plans[bits] = (version, self._plan(responses))
        pop = self._waiting.pop
        for unit in cached[1]:
            if type(unit) is not _FusedGroup:
                resp, _, ps = unit
                self._run_single_and_finish(resp, pop(resp.name, None), ps)
                continue
            reqs = [pop(n, None) for n in unit.names]
            if len(reqs) == 1 or None in reqs or unit.resps[0].key[10] != "cpu":
                self._run_allreduce(unit.resps, reqs, unit.ps)
                continue
            key = unit.resps[0].key
            dtype = reqs[0].tensor.dtype
            buf = self._fusion_buffer(dtype, unit.nbytes // reqs[0].tensor.element_size(), reqs[0].tensor.device)
            parts = buf.split(unit.sizes)
            if unit.flat:
                torch._foreach_copy_(parts, [q.tensor for q in reqs])
            else:
                torch._foreach_copy_(parts, [_flat(q.tensor) for q in reqs])
            try:
                self._reduce_buffer(buf, ReduceOp(key[4]), key[7], key[8], reqs[0].compressor, unit.ps.group,
                                    self.backend, unit.sizes)
            except CollectiveError:
                raise
            except Exception as exc:
                err = CollectiveError(f"allreduce of {unit.names[:5]}... failed: {exc}")
                for q in reqs:
                    self._finish(q, error=err)
                continue
            if unit.flat:
                torch._foreach_copy_([q.output for q in reqs], list(parts))
            else:
                torch._foreach_copy_([_flat(q.output) for q in reqs], list(parts))
            self._finish_fused(reqs, unit.nbytes)

    def _finish_fused(self, reqs: list[Request], nbytes: int, fused: bool = True) -> None:
        """Complete allreduces whose results were copied out of one fused collective of
        ``nbytes`` (or, ``fused=False``, reduced in place by it), and count it."""
        completed = self._completed
        for q in reqs:
            q._result = q.output
            completed.append(q)
        st = self.stats
        if fused:
            st["fused_batches"] += 1
            st["fused_tensors"] += len(reqs)
        st["allreduce_tensors"] += len(reqs)
        st["allreduce_calls"] += 1
        st["allreduce_bytes"] += nbytes

    def _fusion_buffer(self, dtype: torch.dtype, numel: int, device: torch.device) -> torch.Tensor:
        key = (dtype, device)
        buf = self._fusion.get(key)
        if buf is None or buf.numel() < numel:
            cap = max(numel, self.config.fusion_threshold // torch.empty((), dtype=dtype).element_size())
            buf = torch.empty(cap, dtype=dtype, device=device)
            self._fusion[key] = buf
        return buf[:numel]

    def _run_allreduce(self, resps: list[_Response], reqs: list[Request | None], ps: ProcessSetInfo) -> None:
        tl = self.timeline
        key = resps[0].key
        dtype = getattr(torch, key[1])
        op = ReduceOp(key[4])
        pre, post = key[7], key[8]
        compressor = None
        for req in reqs:
            if req is not None:
                compressor = req.compressor
                break
        if compressor is None:
            from hora.native.compression import resolve

            compressor = resolve(key[9]) if key[9] in ("none", "fp16", "bf16") else NoneCompressor
        dev_type = key[10] or "cpu"
        device = next((req.tensor.device for req in reqs if req is not None), None)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dev_type == "cuda" else torch.device("cpu")
        if dev_type != "cpu":
            for req in reqs:
                if req is not None and req.ready_event is not None:
                    req.ready_event.synchronize()
        t_start = tl.now() if tl.enabled else 0.0
        if tl.enabled:
            for resp, req in zip(resps, reqs):
                if req is not None:
                    tl.span(resp.name, "QUEUE", req.t_ready, t_start)
        complete = None not in reqs
        if len(resps) == 1:
            req = reqs[0]
            if req is None:
                buf = torch.zeros(resps[0].numel, dtype=dtype, device=device)
            else:
                buf = _flat(req.output)
                if req.output is not req.tensor:
                    buf.copy_(_flat(req.tensor))
            fused = False
        else:
            buf = self._fusion_buffer(dtype, sum(r.numel for r in resps), device)
            parts = buf.split([r.numel for r in resps])
            if complete:
                torch._foreach_copy_(parts, [_flat(req.tensor) for req in reqs])
            else:
                dsts, srcs = [], []
                for req, part in zip(reqs, parts):
                    if req is None:
                        part.zero_()
                    else:
                        dsts.append(part)
                        srcs.append(_flat(req.tensor))
                if dsts:
                    torch._foreach_copy_(dsts, srcs)
            fused = True
            self.stats["fused_batches"] += 1
            self.stats["fused_tensors"] += len(resps)
            if tl.enabled:
                t1 = tl.now()
                for resp, req in zip(resps, reqs):
                    tl.span(resp.name, "FUSE_COPY_IN", t_start, t1)
                t_start = t1
        try:
            self._reduce_buffer(buf, op, pre, post, compressor, self._group_for(ps, dev_type),
                                self._backend_for(dev_type), [r.numel for r in resps])
        except CollectiveError:
            raise
        except Exception as exc:
            err = CollectiveError(f"allreduce of {[r.name for r in resps]} failed: {exc}")
            for req in reqs:
                if req is not None:
                    self._finish(req, error=err)
            return
        if tl.enabled:
            t1 = tl.now()
            for resp in resps:
                tl.span(resp.name, "COLLECTIVE", t_start, t1, bytes=resp.nbytes, fused=len(resps))
            t_start = t1
        self.stats["allreduce_tensors"] += len(resps)
        self.stats["allreduce_calls"] += 1
        self.stats["allreduce_bytes"] += buf.numel() * buf.element_size()
        if fused:
            if complete:
                torch._foreach_copy_([_flat(req.output) for req in reqs], list(parts))
            else:
                outs, srcs = [], []
                for req, part in zip(reqs, parts):
                    if req is not None:
                        outs.append(_flat(req.output))
                        srcs.append(part)
                if outs:
                    torch._foreach_copy_(outs, srcs)
            if tl.enabled:
                t1 = tl.now()
                for resp in resps:
                    tl.span(resp.name, "FUSE_COPY_OUT", t_start, t1)
        completed = self._completed
        for req in reqs:
            if req is not None:
                req._result = req.output
                completed.append(req)

    def _reduce_buffer(self, buf: torch.Tensor, op: ReduceOp, pre: float, post: float, compressor: Any,
                       group: Group, backend: Backend | None = None, segments: Sequence[int] | None = None) -> None:
        """Reduce ``buf`` in place over ``group``: prescale, compress, reduce, average, postscale.

        ``segments``: the element counts of the tensors fused in ``buf`` (Adasum gives
        each its own coefficients; the other ops need not know)."""
        if pre != 1.0:
            _scale_(buf, pre)
        wire_op = ReduceOp.Sum if op == ReduceOp.Average else op
        wire, ctx = compressor.compress(buf) if buf.is_floating_point() else (buf, None)
        be = backend or self.backend
        if op == ReduceOp.Adasum:
            adasum.allreduce(wire, segments or [wire.numel()], be, group)
        elif not be.supports_reduce(wire.dtype, wire_op):
            up = wire.to(torch.float64 if wire.dtype in (torch.int32, torch.int64, torch.float64) else torch.float32)
            be.allreduce(up, wire_op, group)
            wire.copy_(up)
        else:
            be.allreduce(wire, wire_op, group)
        if wire is not buf:
            buf.copy_(compressor.decompress(wire, ctx))
        if op == ReduceOp.Average:
            if buf.is_floating_point() or post != 1.0:
                post = post / group.size  # (integers: one truncation, after the postscale)
            else:
                buf.div_(group.size, rounding_mode="trunc")
        if post != 1.0:
            _scale_(buf, post)

    def _run_single(self, resp: _Response, req: Request | None, ps: ProcessSetInfo | None) -> Any:
        kind = resp.kind
        tl = self.timeline
        t0 = tl.now() if tl.enabled else 0.0
        if tl.enabled and req is not None:
            tl.span(resp.name, "QUEUE", req.t_ready, t0)
        result = self._dispatch(kind, resp, req, ps)
        if tl.enabled:
            tl.span(resp.name, "COLLECTIVE", t0, tl.now(), kind=kind)
        self.stats[f"{kind}_calls"] += 1
        return result

    def _dispatch(self, kind: str, resp: _Response, req: Request | None, ps: ProcessSetInfo | None) -> Any:
        be = self.backend
        dev_type = (resp.key[10] if resp.key else "") or "cpu"
        if kind == PS_ADD:
            ps_id, ranks = resp.key[11]
            group = be.new_group(ranks, ps_id)
            self.process_sets[ps_id] = ProcessSetInfo(ps_id, ranks, group)
            self._ps_version += 1
            return ps_id
        if kind == PS_REMOVE:
            ps_id = resp.key[11]
            info = self.process_sets.pop(ps_id, None)
            self._ps_version += 1
            if info is not None:
                for dev, g in info.device_groups.items():
                    self.device_backends.get(dev, be).destroy_group(g)
                for e in [e for e in self.cache.by_name.values() if e.ps_id == ps_id]:
                    self.cache.erase(e.name)
            return ps_id
        assert ps is not None
        group = ps.group
        if dev_type != "cpu":
            be = self._backend_for(dev_type)
            group = self._group_for(ps, dev_type)
        if req is not None and req.ready_event is not None:
            req.ready_event.synchronize()
        if kind == JOIN:
            return resp.extra_result
        if kind == BARRIER:
            be.barrier(group)
            return None
        if req is None:
            raise CollectiveError(f"rank {self.rank} has joined and cannot take part in {kind} '{resp.name}'")
        if kind == BROADCAST:
            be.broadcast(req.output, group.ranks.index(req.root), group)
            return req.output
        if kind == ALLGATHER:
            rows = [resp.locals[r][0] for r in group.ranks]
            rest = tuple(req.tensor.shape[1:])
            inp = req.tensor
            if len(set(rows)) == 1:
                out = torch.empty((sum(rows),) + rest, dtype=inp.dtype, device=inp.device)
                be.allgather(out, inp, group)
                return out
            mx = max(rows)
            padded = torch.zeros((mx,) + rest, dtype=inp.dtype, device=inp.device)
            padded[: inp.shape[0]] = inp
            tmp = torch.empty((mx * group.size,) + rest, dtype=inp.dtype, device=inp.device)
            be.allgather(tmp, padded, group)
            return torch.cat([tmp[i * mx : i * mx + n] for i, n in enumerate(rows)])
        if kind == ALLTOALL:
            me = group.rank
            send = list(req.splits)
            recv = [resp.locals[r][1][me] for r in group.ranks]
            rest = tuple(req.tensor.shape[1:])
            out = torch.empty((sum(recv),) + rest, dtype=req.tensor.dtype, device=req.tensor.device)
            be.alltoall(out, req.tensor, recv, send, group)
            return out, torch.tensor(recv, dtype=torch.int32)
        if kind == REDUCESCATTER:
            t = req.tensor
            n = group.size
            rows = t.shape[0] if t.dim() else 1
            counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
            op = ReduceOp(resp.key[4])
            pre, post = resp.key[7], resp.key[8]
            wire_op = ReduceOp.Sum if op == ReduceOp.Average else op
            if rows % n == 0 and be.supports_reduce(t.dtype, wire_op):
                inp = t
                if pre != 1.0:
                    inp = t.clone()
                    _scale_(inp, pre)
                out = torch.empty((counts[group.rank],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
                be.reducescatter(out, inp, wire_op, group)
                if op == ReduceOp.Average and (out.is_floating_point() or post != 1.0):
                    post = post / n
                elif op == ReduceOp.Average:
                    out.div_(n, rounding_mode="trunc")
                if post != 1.0:
                    _scale_(out, post)
            else:
                tmp = t.clone()
                self._reduce_buffer(tmp.view(-1), op, pre, post, NoneCompressor, group, be)
                start = sum(counts[: group.rank])
                out = tmp[start : start + counts[group.rank]].clone()
            return out
        raise CollectiveError(f"unknown collective kind {kind!r}")


_I32_MAX = int(np.iinfo(np.int32).max)
_MISS, _HIT, _PURE_HIT = range(3)  # outcomes of Engine._spec_collective
_NO_CLAIM, _OFFERED, _CLAIMED, _RAN = range(4)  # a predicted round offered to a blocking caller


class _Spec:
    """A predicted round, identical on every rank: the cached ops every rank expects next
    (see Engine._make_spec for the three kinds)."""

    __slots__ = ("slots", "slot_set", "names", "name_set", "sizes", "numel", "dtype", "prescale", "postscale",
                 "average", "offsets", "_parts", "unclaimed", "skipped", "piggyback", "inplace", "bits")

    def __init__(self, slots: list[int], names: list[str], sizes: list[int], dtype: torch.dtype | None,
                 prescale: float, postscale: float, average: bool, piggyback: bool = True,
                 inplace: bool = False, bits: bytes = b"") -> None:
        self.bits = bits  # the cached-response bits of the round predicted
        self.piggyback = piggyback  # False: only waited for locally, then a normal round
        self.inplace = inplace  # one tensor with room: reduced in place (Engine._spec_collective)
        self.slots = slots
        self.slot_set = frozenset(slots)
        self.names = names
        self.name_set = frozenset(names)
        self.sizes = sizes
        self.numel = sum(sizes)
        self._parts: tuple[Any, list[torch.Tensor]] | None = None
        self.unclaimed = 0  # offers to a blocking caller in a row that nobody took
        self.skipped = 0  # rounds not offered since (see Engine._gather_predicted)
        self.offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for name, n in zip(names, sizes):
            self.offsets[name] = (off, n)
            off += n
        self.dtype = dtype
        self.prescale = prescale
        self.postscale = postscale
        self.average = average


    def should_offer(self) -> bool:
        """Offer the round to a blocking caller, unless the last two offers went
        unclaimed; then offer again every 16th round (the caller may have sped up)."""
        if self.unclaimed < 2:
            return True
        self.skipped += 1
        if self.skipped >= 16:
            self.skipped = self.unclaimed = 0
        return False

    def parts_of(self, data: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``data`` (the fusion buffer's data part), one per tensor, kept while
        the buffer stays the same (splitting a thousand views costs more than a copy)."""
        key = (data.data_ptr(), data.numel())
        if self._parts is None or self._parts[0] != key:
            self._parts = (key, list(data.split(self.sizes)))
        return self._parts[1]


class _FusedGroup:
    __slots__ = ("ps", "resps", "reqs", "nbytes", "names", "sizes", "flat")

    def __init__(self, ps: ProcessSetInfo) -> None:
        self.ps = ps
        self.resps: list[_Response] = []
        self.reqs: list[Request | None] = []
        self.nbytes = 0


def _fuse_into(units: list[Any], open_groups: dict[tuple, _FusedGroup], threshold: int, resp: _Response,
               ps: ProcessSetInfo) -> _FusedGroup:
    """Add an allreduce response to the open fusion group of its key, opening a new group (a
    new execution unit) when the threshold would be passed; return the group it joined."""
    g = open_groups.get(resp.fkey)
    if g is None or (g.nbytes + resp.nbytes > threshold and g.nbytes > 0):
        g = open_groups[resp.fkey] = _FusedGroup(ps)
        units.append(g)
    g.resps.append(resp)
    g.nbytes += resp.nbytes
    return g


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 1 else t.view(-1)


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_ITEMSIZE: dict[str, int] = {}


def _itemsize(dtype: str) -> int:
    s = _ITEMSIZE.get(dtype)
    if s is None:
        s = _ITEMSIZE[dtype] = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return s


def _scale_(buf: torch.Tensor, factor: float) -> None:
    """Multiply in place; integer tensors are scaled in float64 and rounded toward zero
    (as Horovod, and as a cast of the float64 product would)."""
    if buf.is_floating_point():
        buf.mul_(factor)
    else:
        buf.copy_(torch.trunc(buf.to(torch.float64) * factor).to(buf.dtype))


class _Autotuner:
    """Searches fusion threshold and cycle time during the first steps (HORA_AUTOTUNE=1).

    Rank 0 scores each candidate (threshold, cycle time) by bytes reduced per second
    over ``WINDOW`` rounds that did work, moves to the next candidate, and finally keeps
    the best and logs it. Rank 0's current candidate travels in every negotiation round's
    control vector and every rank applies it before executing that round, so all ranks
    always group tensors with the same threshold.
    """

    THRESHOLDS = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
    CYCLES = (0.0005, 0.001, 0.0025, 0.005)
    WINDOW = 20

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.candidates = [(t, c) for t in self.THRESHOLDS for c in self.CYCLES]
        self.window = int(_env_number("HORA_AUTOTUNE_WINDOW", self.WINDOW, allow_zero=False))
        self.index = 0
        self.applied = -1
        self.scores: list[float] = []
        self.window_rounds = 0
        self.window_bytes = 0
        self.window_start = time.perf_counter()
        self.done = False

    def apply(self, index: int) -> None:
        if index == self.applied or not 0 <= index < len(self.candidates):
            return
        self.applied = index
        t, c = self.candidates[index]
        self.engine.config.fusion_threshold = t
        self.engine.config.cycle_time = c

    def observe(self, responses: list[_Response]) -> None:
        if self.done or not responses:
            return
        self.window_rounds += 1
        self.window_bytes += sum(
            _numel(r.key[2]) * _itemsize(r.key[1]) for r in responses if r.key and r.key[1] and r.error is None
        )
        if self.window_rounds < self.window:
            return
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        self.scores.append(self.window_bytes / elapsed)
        self.window_rounds = 0
        self.window_bytes = 0
        if len(self.scores) >= len(self.candidates):
            best = max(range(len(self.scores)), key=self.scores.__getitem__)
            self.index = best
            self.done = True
            t, c = self.candidates[best]
            log.info("autotune: chose fusion threshold %d bytes and cycle time %.2f ms (%.1f MB/s)",
                     t, c * 1000, self.scores[best] / 1e6)
        else:
            self.index = len(self.scores)
        self.window_start = time.perf_counter()
