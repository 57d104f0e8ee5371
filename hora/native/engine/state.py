"""The engine's state: what its parts share, in one object the :class:`~.engine.Engine` owns.

:class:`EngineState` holds the job-wide replicated tables (response cache, control
vector, process sets, negotiation), the hand-over between callers and the engine
thread (the lock and its conditions, submitted and waiting requests, the
:class:`Offer` of a predicted round) and the completion of requests
(:meth:`EngineState.finish` ... :meth:`EngineState.notify_done`). The engine hands it to
its loop (:class:`~.loop.RoundLoop`), executor (:class:`~.execute.Executor`) and
speculator (:class:`~.speculation.Speculator`); handles reach it only through the
engine's public methods. The state imports none of those parts: they build on it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from hora.errors import CollectiveError
from hora.native.backends.base import Backend, Group
from hora.native.engine.cache import Response, ResponseCache
from hora.native.engine.config import EngineConfig, Tuning
from hora.native.engine.control import ControlVector
from hora.native.engine.negotiation import Negotiator, ProcessSetInfo
from hora.native.engine.request import PS_ADD, Handle, Request
from hora.native.engine.stalls import StallInspector
from hora.native.timeline import Timeline

log = logging.getLogger(__name__)

NO_CLAIM, OFFERED, CLAIMED, RAN = range(4)  # a predicted round offered to a blocking caller


class Offer:
    """(Under the state's lock.) The hand-over of a round between the thread and callers:
    what a predicted round still misses, and whether a blocking caller runs it."""

    __slots__ = ("missing", "foreign", "stage", "spec", "claim", "args", "result", "burst_end", "gathering", "gen",
                 "armed_at", "defer")

    def __init__(self) -> None:
        self.missing: set[str] | None = None  # predicted names this rank has not submitted yet
        self.foreign = False  # something unpredicted was submitted meanwhile
        self.stage: torch.Tensor | None = None  # where big predicted tensors are copied at submit
        self.spec: Any = None  # the prediction being gathered (a speculation.Spec)
        self.claim = NO_CLAIM
        self.args: tuple | None = None  # the round a claiming caller runs
        self.result: Any = None  # what it returned (or raised)
        self.burst_end = False  # a caller ended a burst of submissions (ops.end_burst)
        self.gathering = False  # the thread is waiting for submissions to settle
        self.gen = 0  # rounds offered so far (a caller that ran one offers the next: see RoundLoop.arm)
        self.armed_at = 0.0  # when the current round was offered (time.monotonic)
        self.defer = False  # completing the round does not wake the thread (a blocking caller will run it)


class EngineState:
    """What the engine's parts share (one per engine)."""

    def __init__(self, backend: Backend, config: EngineConfig, timeline: Timeline,
                 device_backend_factories: dict[str, Callable[[], Backend]] | None = None) -> None:
        self.backend = backend
        self.device_backends: dict[str, Backend] = {"cpu": backend}
        self.device_factories = dict(device_backend_factories or {})
        self.rank = backend.rank
        self.size = backend.size
        self.config = config
        self.tuning = Tuning.of(config)
        self.timeline = timeline
        self.stats: collections.Counter[str] = collections.Counter()
        # replicated on every rank (changed only by rounds' job-wide results)
        self.cache = ResponseCache(config.cache_capacity)
        self.control = ControlVector(config.cache_capacity)
        self.process_sets: dict[int, ProcessSetInfo] = {0: ProcessSetInfo(0, range(self.size), backend.world)}
        self.ps_version = 0
        self.negotiator = Negotiator(self.rank, self.size, self.process_sets, self.cache)
        self.stalls = StallInspector(config, self.negotiator, self.cache, self.stats)
        # this rank's requests, and the hand-over between callers and the thread
        self.waker = backend.make_waker()
        self.lock = threading.Lock()
        self.gather_cond = threading.Condition(self.lock)  # the thread waits here for submissions to settle
        self.done_cond = threading.Condition(threading.Lock())  # callers wait here for their handles
        self.blocked: list[Handle] = []  # handles callers block on: rounds stop waiting for more work
        self.offer = Offer()
        self.completed: list[Handle] = []
        self.incoming: list[Request] = []
        self.names: dict[str, Request] = {}  # every request submitted here and not finished
        self.waiting: dict[str, Request] = {}  # reported to the negotiation, not finished
        self.caller_round = False  # the round running now is a blocking caller's (see Engine.request_flush)
        # the idle wait (see RoundLoop.active_wait)
        self.epoch = 0
        self.idle = False
        self.woken = False
        # shutting down
        self.shutting_down = False
        self.broken: BaseException | None = None
        self.aborted = False  # shutdown gave up waiting for the others: leave at the next chance

    @property
    def flush(self) -> bool:
        """(Under the lock.) Whether a caller is blocked on a handle that is not done."""
        return any(not h._done for h in self.blocked)

    def wake_locked(self) -> None:
        """(Under the lock.) Get an idle engine thread to run a round (or, alone, to exit)."""
        if self.idle and not self.woken:
            self.woken = True
            try:
                if self.size == 1:
                    self.waker.wake_self(self.epoch)
                else:
                    self.waker.signal(self.epoch)
            except Exception as exc:  # the store's host is gone: the thread notices by itself
                log.debug("rank %d: cannot wake the engine: %s", self.rank, exc)

    # -- backends and groups ------------------------------------------------------------------
    def supports_device(self, device: str) -> bool:
        """Whether tensors on ``device`` ("cpu", "cuda") can be communicated."""
        return device in self.device_backends or device in self.device_factories

    def backend_for(self, device: str) -> Backend:
        """The backend of tensors on ``device`` (made at first use, on every rank alike).

        Raises:
            CollectiveError: no backend handles ``device`` here.
        """
        be = self.device_backends.get(device)
        if be is None:
            factory = self.device_factories.get(device)
            if factory is None:
                raise CollectiveError(f"no backend for tensors on {device!r} on rank {self.rank}")
            be = self.device_backends[device] = factory()  # every rank reaches this in the same order
            self.process_sets[0].device_groups[device] = be.world
        return be

    def group_for(self, ps: ProcessSetInfo, device: str) -> Group:
        """``ps``'s group on the backend of ``device``."""
        g = ps.device_groups.get(device)
        if g is None:
            be = self.backend_for(device)
            g = ps.device_groups.get(device)
            if g is None:
                g = ps.device_groups[device] = be.new_group(ps.ranks, ps.id)
        return g

    def apply_process_set_op(self, resp: Response) -> int:
        """Register or remove a process set (an agreed PS_ADD/PS_REMOVE); returns its id."""
        be = self.backend
        if resp.kind == PS_ADD:
            ps_id, ranks = resp.key.extra
            group = be.new_group(ranks, ps_id)
            self.process_sets[ps_id] = ProcessSetInfo(ps_id, ranks, group)
            self.ps_version += 1
            return ps_id
        ps_id = resp.key.extra
        info = self.process_sets.pop(ps_id, None)
        self.ps_version += 1
        if info is not None:
            for dev, g in info.device_groups.items():
                self.device_backends.get(dev, be).destroy_group(g)
            for e in [e for e in self.cache.by_name.values() if e.ps_id == ps_id]:
                self.cache.erase(e.name)
        return ps_id

    # -- completing requests (the thread, or a caller running a round) -------------------------
    def finish(self, req: Request, result: Any = None, error: BaseException | None = None) -> None:
        """Complete ``req``'s handle; callers are woken by :meth:`notify_done`."""
        h = req.handle
        if h is None:
            return
        if error is not None:
            h._error = error
        else:
            h._result = result
        self.completed.append(h)

    def finish_fused(self, reqs: list[Request], nbytes: int, fused: bool = True,
                     waiting: dict[str, Request] | None = None) -> None:
        """Complete allreduces whose results were copied out of one fused collective of
        ``nbytes`` (or, ``fused=False``, reduced in place by it), and count it; remove
        them from ``waiting`` when given."""
        append = self.completed.append
        if waiting is not None:
            pop = waiting.pop
            for q in reqs:
                pop(q.name, None)
                q._result = q.output
                append(q)
        else:
            for q in reqs:
                q._result = q.output
                append(q)
        self.count_allreduce(len(reqs), nbytes, fused)

    def count_allreduce(self, tensors: int, nbytes: int, fused: bool) -> None:
        st = self.stats
        if fused:
            st["fused_batches"] += 1
            st["fused_tensors"] += tensors
        st["allreduce_tensors"] += tensors
        st["allreduce_calls"] += 1
        st["allreduce_bytes"] += nbytes

    def complete_now(self, reqs: list[Request], results: list[Any], nbytes: int, fused: bool) -> None:
        """Complete ``reqs`` (allreduces of one fused collective of ``nbytes``, or
        ``fused=False`` one reduced in place) with ``results``.

        In a round a blocking caller runs (``Engine.request_flush``), at once: what
        :meth:`finish_fused` and :meth:`notify_done` do together, in one pass over the
        requests (a predicted round of a thousand small tensors; see
        ``Speculator.collective``). The names are freed before the handles are done, so a
        caller that sees its handle done may submit the name again at once. In a round
        of the engine thread, when the round ends (:meth:`notify_done`), as any other
        result: a caller woken earlier would submit its next step before the thread
        offers that step's predicted round, which the thread then runs itself, and the
        rounds would stay with the thread instead of passing to the caller."""
        if not self.caller_round:
            wpop = self.waiting.pop
            append = self.completed.append
            for q, r in zip(reqs, results):
                wpop(q.name, None)
                q._result = r
                append(q)
        else:
            wpop = self.waiting.pop
            npop = self.names.pop
            with self.lock:
                for q, r in zip(reqs, results):
                    name = q.name
                    wpop(name, None)
                    npop(name, None)
                    q._result = r
                    q._done = True
            with self.done_cond:
                self.done_cond.notify_all()
        self.count_allreduce(len(reqs), nbytes, fused)

    def notify_done(self) -> None:
        """Mark the completed handles done and wake their callers."""
        done, self.completed = self.completed, []
        if not done:
            return
        pop = self.names.pop
        with self.lock:
            for h in done:
                pop(h.name, None)
                h._done = True
        with self.done_cond:
            self.done_cond.notify_all()

    def fail_handles(self, reqs: list[Request], exc: BaseException) -> None:
        """Fail the handles of ``reqs`` not done yet with ``exc`` and wake their callers."""
        for r in reqs:
            h = r.handle
            if h is not None and not h._done:
                h._error = exc
                h._done = True
        with self.done_cond:
            self.done_cond.notify_all()


__all__ = ["CLAIMED", "NO_CLAIM", "OFFERED", "RAN", "EngineState", "Offer"]
