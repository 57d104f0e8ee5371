"""The process's engine state and its lifecycle: :func:`init`, :func:`shutdown`, the job's
placement (:func:`rank`, :func:`size`, ...), process-set registration and the timeline.

One :class:`_State` per initialized process (``None`` before :func:`init` and after
:func:`shutdown`): the backend, the :class:`~hora.native.engine.Engine`, this rank's
place in the job and the process sets registered in this generation. The op modules
(:mod:`.collectives`, :mod:`.objects`) build on it; :mod:`.process_sets` (the
:class:`ProcessSet` type) is below it and learns the job's rank and size from it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from hora.errors import ConfigError, NotInitializedError
from hora.native import process_sets as _ps_mod
from hora.native.backends.base import Backend
from hora.native.engine import PS_ADD, PS_REMOVE, Engine, EngineConfig, Handle, Request, auto_name
from hora.native.process_sets import ProcessSet, global_process_set
from hora.native.timeline import Timeline

log = logging.getLogger("hora.native.ops")


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
        self.counters: dict[tuple[str, int], int] = {}  # unnamed ops by (kind, process set id)
        self.next_ps_id = 1
        self.registered: list[ProcessSet] = []  # unbound at shutdown
        self.lock = threading.Lock()

    def auto_name(self, kind: str, process_set_id: int = 0) -> str:
        """The name of the next unnamed ``kind`` op over process set ``process_set_id``.

        Counted per (kind, process set): only a set's members submit its ops, so an
        unnamed op over a subset must not advance a counter that ranks outside the set
        share (their next unnamed global op would get another name than their peers').
        """
        key = (kind, process_set_id)
        with self.lock:
            n = self.counters.get(key, 0)
            self.counters[key] = n + 1
        return auto_name(kind, process_set_id, n)

    def forget_names(self, process_set_id: int) -> None:
        """Drop the unnamed-op counters of a removed process set."""
        with self.lock:
            for key in [k for k in self.counters if k[1] == process_set_id]:
                del self.counters[key]


_state: _State | None = None
_init_lock = threading.Lock()
_atexit_registered = False


def _state_or_raise() -> _State:
    st = _state
    if st is None:
        raise NotInitializedError("hora has not been initialized; call hora.init()")
    return st




def _submit(req: Request, post: Any) -> Handle:
    h = _state_or_raise().engine.submit(req)
    if post is not None:
        h._post = post
    return h


# ---------------------------------------------------------------------------------------
# life cycle
# ---------------------------------------------------------------------------------------
def init(process_sets: Sequence[ProcessSet | Sequence[int]] | str | None = None, *, comm: Any = None) -> None:
    """Join the job described by the ``HORA_*`` environment and start the engine.

    The backend is ``HORA_BACKEND`` (auto, gloo, nccl, mpi). ``auto`` picks MPI when the
    process was started by ``mpiexec`` (PMI_RANK, OMPI_COMM_WORLD_RANK or PMIX_RANK set)
    and no hora rendezvous address is given, else Gloo (plus NCCL for CUDA tensors when a
    GPU is present). Without any launcher variables the job has one rank and needs no
    network. ``process_sets`` are registered (collectively) after start-up (Horovod's
    ``"dynamic"`` registers none: hora always allows adding them later).

    ``init -> shutdown -> init`` may repeat any number of times: each init joins the job's
    next *generation* (rank 0 opens it on the rendezvous store, the others join the
    newest one), with fresh stores, groups and shared memory. Calling init while
    initialized is a no-op, as in Horovod, unless the engine can no longer run the job's
    collectives (it failed, or another rank has shut down): then init shuts it down and
    joins the next generation, as an elastic reset does.

    Raises:
        ConfigError: unknown backend, malformed environment, or Horovod's ``comm=``
            (a subset of MPI ranks), which hora does not support.
        RendezvousError: peers never arrived within ``HORA_START_TIMEOUT``.
    """
    global _state, _atexit_registered
    if comm is not None and not (isinstance(comm, (list, tuple)) and not comm):
        raise ConfigError(f"init(comm={comm!r}): hora runs collectives over every rank the launcher started; "
                          "to work on a subset of ranks, register it with add_process_set(ranks)")
    if isinstance(process_sets, str):
        if process_sets.strip().lower() != "dynamic":
            raise ConfigError(f"init(process_sets={process_sets!r}): pass a list of ProcessSet (or of rank lists), "
                              "'dynamic' or None")
        process_sets = None
    with _init_lock:
        if _state is not None:
            reason = _state.engine.unusable_reason()
            if reason is None:
                return
            log.warning("rank %d: hora.init(): the running engine %s; shutting it down and joining the job "
                        "afresh", _state.rank, reason)
            _shutdown_locked()
        from hora.native.backends import create_backend, requested_backend
        from hora.native.backends.nccl import nccl_available

        if requested_backend() == "nccl" and not nccl_available():
            raise ConfigError("HORA_BACKEND=nccl, but this torch build has no NCCL or no GPU is visible; "
                              "use HORA_BACKEND=gloo (or auto)")
        backend, placement, extras = create_backend()
        try:
            config = EngineConfig()
            timeline = Timeline.from_environ(backend.rank)
            engine = Engine(backend, config, timeline, _device_factories(backend, placement[0]))
        except BaseException:
            _release(None, backend, extras)
            raise
        _state = _State(backend, engine, *placement, extras=extras)
        _ps_mod._bind_world((backend.rank, backend.size))
        if not _atexit_registered:
            atexit.register(shutdown)  # drain and stop the engine even if the script forgets
            _atexit_registered = True
        log.debug("hora initialized: rank %d of %d on %s (fusion %d B, cycle %.2f ms, cache %d)",
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
    """Stop the engine and release everything :func:`init` built (idempotent).

    The engine thread is stopped and joined first (collectively: see
    :meth:`Engine.shutdown <hora.native.engine.Engine.shutdown>`); only then are its
    process sets' groups, shared memory, backends, stores and sockets released, so no
    thread is ever inside a resource being freed. A thread stuck in a backend call that
    cannot be interrupted releases them itself when the call returns.
    """
    with _init_lock:
        _shutdown_locked()


def _shutdown_locked() -> None:
    global _state
    st, _state = _state, None
    if st is None:
        return
    _ps_mod._bind_world(None)
    try:
        ended = st.engine.shutdown()
    finally:
        for ps in st.registered:
            ps.process_set_id = None  # a set of an earlier init is not registered in the next
        global_process_set.ranks = None
    engine, backend, extras = st.engine, st.backend, st.extras
    if ended:
        _release(engine, backend, extras)
    else:
        log.warning("rank %d: the hora engine thread is inside a backend call; it releases the backend when "
                    "the call returns", st.rank)
        engine.on_exit(lambda: _release(engine, backend, extras))


def _release(engine: Engine | None, backend: Backend, extras: list[Any]) -> None:
    """Release an engine's groups and backends, then the objects init made for it."""
    try:
        if engine is not None:
            engine.release()
        else:
            backend.shutdown()
    finally:
        for obj in extras:
            close = getattr(obj, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # best effort
                    pass


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


def torch_store() -> Any:
    """The ``torch.distributed`` Store every rank of the current init shares (built by hora's
    rendezvous for its collectives), or None when the backend has none.

    Raises:
        NotInitializedError: hora is not initialized.
    """
    return _state_or_raise().backend.torch_store()


def engine_stats() -> dict[str, int]:
    """Counters of the engine: rounds, cache_hits, cache_misses, fused_batches, ..."""
    return _state_or_raise().engine.engine_stats()




# ---------------------------------------------------------------------------------------
# process sets and the timeline
# ---------------------------------------------------------------------------------------
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
    st.registered.append(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (collective over every rank). Returns True if it was registered."""
    st = _state_or_raise()  # NotInitializedError before init()
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False
    ps_id = process_set.process_set_id
    req = Request(PS_REMOVE, f"process_set.remove.{ps_id}", 0, extra=ps_id)
    _submit(req, None).synchronize()
    process_set.process_set_id = None
    st.forget_names(ps_id)
    st.registered = [p for p in st.registered if p is not process_set]
    return True

def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline to ``file_path`` (Horovod's ``hvd.start_timeline``): a
    Chrome trace of every op's phases, written by rank 0 (every rank with
    ``HORA_TIMELINE_ALL_RANKS=1``, to ``file_path.rank<r>``) when :func:`stop_timeline`
    or :func:`shutdown` is called. ``mark_cycles`` adds a marker per negotiation round.
    A timeline already recording is written first.

    Raises:
        NotInitializedError: before init().
        ConfigError: ``file_path`` is empty or not a string.
    """
    st = _state_or_raise()
    if not isinstance(file_path, (str, os.PathLike)) or not str(file_path):
        raise ConfigError(f"start_timeline: file_path must be a path, got {file_path!r}")
    st.engine.set_timeline(Timeline.for_rank(str(file_path), st.rank, mark_cycles=bool(mark_cycles)))


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` (or ``HORA_TIMELINE``) and write it.

    Raises:
        NotInitializedError: before init().
    """
    st = _state_or_raise()
    st.engine.set_timeline(Timeline(None, st.rank))


__all__ = [
    "add_process_set", "backend_name", "cross_rank", "cross_size", "engine_stats", "init", "is_initialized",
    "local_rank", "local_size", "rank", "remove_process_set", "shutdown", "size", "start_timeline", "stop_timeline",
    "torch_store",
]
