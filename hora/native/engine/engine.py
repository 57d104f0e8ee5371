"""The :class:`Engine`: submission from any thread, handles, shutdown and release.

The background thread's rounds are :class:`~.loop.RoundLoop`'s; this module is what
callers touch: :meth:`Engine.submit` enqueues a request and wakes the job,
:meth:`Engine.request_flush` lets a caller that blocks on a handle run a predicted
round in its own thread, and :meth:`Engine.shutdown` stops the engine collectively.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from hora.errors import CollectiveError, ConfigError
from hora.native.backends.base import Backend, Group
from hora.native.engine.autotune import Autotuner
from hora.native.engine.cache import Response, ResponseCache
from hora.native.engine.config import ABORT_JOIN_TIMEOUT, ENV_SHUTDOWN_TIMEOUT, EngineConfig, Tuning
from hora.native.engine.control import ControlVector
from hora.native.engine.execute import Executor
from hora.native.engine.fusion import flat
from hora.native.engine.loop import CLAIMED, NO_CLAIM, OFFERED, RAN, Offer, RoundLoop
from hora.native.engine.negotiation import Negotiator, ProcessSetInfo
from hora.native.engine.request import PS_ADD, Handle, Request
from hora.native.engine.speculation import STAGE_MIN_NUMEL, Speculator
from hora.native.engine.stalls import StallInspector
from hora.native.timeline import Timeline

log = logging.getLogger(__name__)


class Engine(RoundLoop):
    """Background negotiation and execution of collectives (one per process)."""

    def __init__(self, backend: Backend, config: EngineConfig | None = None, timeline: Timeline | None = None,
                 device_backend_factories: dict[str, Callable[[], Backend]] | None = None) -> None:
        self.backend = backend
        self.device_backends: dict[str, Backend] = {"cpu": backend}
        self._device_factories = dict(device_backend_factories or {})
        self.rank = backend.rank
        self.size = backend.size
        self.config = config or EngineConfig()
        self.tuning = Tuning.of(self.config)
        self.timeline = timeline or Timeline(None, self.rank)
        self.stats: collections.Counter[str] = collections.Counter()
        # replicated on every rank (changed only by rounds' job-wide results)
        self.cache = ResponseCache(self.config.cache_capacity)
        self.control = ControlVector(self.config.cache_capacity)
        self.process_sets: dict[int, ProcessSetInfo] = {0: ProcessSetInfo(0, range(self.size), backend.world)}
        self.ps_version = 0
        self.negotiator = Negotiator(self.rank, self.size, self.process_sets, self.cache)
        self.stalls = StallInspector(self.config, self.negotiator, self.cache, self.stats)
        self.speculator = Speculator(self)
        self.executor = Executor(self)
        self.autotuner = Autotuner(self.config.autotune_window) if self.config.autotune else None
        # this rank's requests, and the hand-over between callers and the thread
        self._waker = backend.make_waker()
        self._lock = threading.Lock()
        self._gather_cond = threading.Condition(self._lock)  # the thread waits here for submissions to settle
        self._done_cond = threading.Condition(threading.Lock())  # callers wait here for their handles
        self._blocked: list[Handle] = []  # handles callers block on: rounds stop waiting for more work
        self._offer = Offer()
        self._completed: list[Handle] = []
        self._incoming: list[Request] = []
        self._names: dict[str, Request] = {}  # every request submitted here and not finished
        self._waiting: dict[str, Request] = {}  # reported to the negotiation, not finished
        self._caller_round = False  # the round running now is a blocking caller's (see request_flush)
        # the thread's state
        self._round_no = 0
        self._epoch = 0
        self._idle = False
        self._woken = False
        self._quiet_rounds = 0
        self._to_forget: list[int] = []
        self._nm_key: tuple = ()
        self._nm_slots: list[int] = []
        self._t_start = time.monotonic()
        # shutting down
        self._shutdown = False
        self._broken: BaseException | None = None
        self._quit_announced = False  # this rank, done, asked for the round that may end the job
        self._quit_sent = False  # this rank told the others it shut down (QUIT metadata)
        self._all_quit = False
        self._aborted = False  # shutdown gave up waiting for the others: leave at the next chance
        self._exit_lock = threading.Lock()
        self._exited = False  # the engine thread has ended
        self._on_exit: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._main, name=f"hora-engine-{self.rank}", daemon=True)
        self._thread.start()

    # -- submission (any thread) ------------------------------------------------------------
    def submit(self, req: Request, blocking: bool = False) -> Handle:
        """Enqueue ``req``; return its handle. ``blocking``: the caller synchronizes on it
        right away (then, when it completes a predicted round, the caller runs that round
        and the engine thread is not woken).

        Raises:
            CollectiveError: the engine has failed or shut down.
            ConfigError: a request with the same name is still in flight on this rank
                (a ValueError, as Horovod's).
        """
        req._engine = self
        if self.timeline.enabled:
            req.t_submit = self.timeline.now()
        name = req.name
        with self._lock:
            if self._broken is not None:
                raise CollectiveError(f"the hora engine has stopped: {self._broken}") from self._broken
            if self._shutdown:
                raise CollectiveError("hora is shutting down; no new collectives are accepted")
            if self._names.setdefault(name, req) is not req:
                raise ConfigError(
                    f"a collective named '{name}' is already in flight on rank {self.rank}; "
                    "wait for it (synchronize) before submitting the same name again"
                )
            self._incoming.append(req)
            offer = self._offer
            missing = offer.missing
            if missing is not None:
                try:
                    missing.remove(name)
                except KeyError:
                    if name not in offer.spec.name_set:
                        offer.foreign = True  # not predicted: negotiate it soon
                        self._gather_cond.notify()
                else:
                    if not missing and offer.claim == NO_CLAIM:
                        offer.claim = OFFERED
                    stage = offer.stage
                    if stage is not None:
                        t = req.tensor
                        if t is not None and t.numel() >= STAGE_MIN_NUMEL:
                            # copy it into its place in the fusion buffer now, while it is hot in
                            # the cache (and while backward still runs), not after the last one;
                            # small tensors are cheaper in the engine's one batched copy
                            off, cnt = offer.spec.offsets[name]
                            if t.dtype == stage.dtype and t.numel() == cnt and t.is_cpu:
                                stage[off : off + cnt].copy_(flat(t))
                                req.staged = self.speculator.stage_token
                                self.speculator.staged += 1
                    if not missing and not blocking and not offer.defer:
                        self._gather_cond.notify()  # this rank now has the whole predicted round
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

    def kick(self) -> None:
        """A caller polls a handle that is not done: when this rank holds the whole
        predicted round and nobody runs it yet, have the engine thread run it now (a
        deferred offer waits for a blocking caller: see ``RoundLoop._arm``)."""
        offer = self._offer
        if offer.claim != OFFERED:
            return
        with self._lock:
            if offer.claim == OFFERED and offer.gathering:
                offer.defer = False
                self._gather_cond.notify()

    def request_flush(self, handle: Handle) -> None:
        """A caller is about to block on ``handle``: stop waiting for more submissions
        while it is pending (until :meth:`end_flush`). When the engine offers a predicted
        round (see ``RoundLoop._gather_predicted``), the caller runs it here, in its own
        thread, and then offers the next predicted round itself (running that one too
        while ``handle`` is still pending and this rank already holds all of it); the
        engine thread is woken only when it has to take over."""
        offer = self._offer
        with self._lock:
            self._blocked.append(handle)
            if offer.claim != OFFERED:
                if offer.gathering:
                    self._gather_cond.notify()
                return
            offer.claim = CLAIMED
            args = offer.args
        while True:
            self.stats["rounds_run_by_caller"] += 1
            spec = args[2]
            # no autograd in the round (the caller may be anywhere): the grad-mode switch
            # itself, 0.7 us, where torch.no_grad()'s context costs 1.9 us
            grad = torch.is_grad_enabled()
            if grad:
                torch._C._set_grad_enabled(False)
            self._caller_round = True
            try:
                result: Any = self._round_body(*args)
            except BaseException as exc:  # noqa: BLE001 - the engine thread raises it
                result = exc
            finally:
                self._caller_round = False
                if grad:
                    torch._C._set_grad_enabled(True)
            with self._lock:
                spec.unclaimed = 0
                spec.claimed += 1
                nxt = self.speculator.spec
                if result is True and nxt is not None and not self._shutdown and not self._aborted:
                    self._arm(nxt, *self._begin_round())
                    if offer.claim == OFFERED and not handle._done:
                        offer.claim = CLAIMED  # the next round is complete here too: run it
                        args = offer.args
                        continue
                    if offer.claim == OFFERED or self._flush:
                        self._gather_cond.notify()  # the engine thread runs it, or waits for the rest
                    return
                offer.result = result
                offer.claim = RAN  # the engine thread takes the loop back
                self._gather_cond.notify_all()
                return

    def end_burst(self) -> None:
        """The caller has submitted a complete group (a bucket of gradients): negotiate
        what is gathered now instead of waiting for the burst to settle."""
        with self._lock:
            offer = self._offer
            offer.burst_end = True
            if offer.gathering and offer.spec is None:  # (a predicted round waits for its names)
                self._gather_cond.notify()

    def end_flush(self, handle: Handle) -> None:
        """The caller of :meth:`request_flush` stopped blocking."""
        with self._lock:
            self._blocked.remove(handle)

    @property
    def _flush(self) -> bool:
        """(Under the lock.) Whether a caller is blocked on a handle that is not done."""
        return any(not h._done for h in self._blocked)

    # -- what callers ask ---------------------------------------------------------------------
    def room_elements(self) -> int:
        """Spare elements a tensor's ``room`` needs after it: the largest control tail, and
        one "holds it" count per rank (see :mod:`.speculation`)."""
        return self.control.max_tail() + self.size

    def supports_device(self, device: str) -> bool:
        """Whether tensors on ``device`` ("cpu", "cuda") can be communicated."""
        return device in self.device_backends or device in self._device_factories

    def backend_for(self, device: str) -> Backend:
        """The backend of tensors on ``device`` (made at first use, on every rank alike).

        Raises:
            CollectiveError: no backend handles ``device`` here.
        """
        be = self.device_backends.get(device)
        if be is None:
            factory = self._device_factories.get(device)
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

    def describe_waiting(self, name: str) -> str:
        """Best-effort text naming the ranks that have (not) submitted ``name``."""
        return self.negotiator.describe_waiting(name)

    def engine_stats(self) -> dict[str, int]:
        s = dict(self.stats)
        s["cache_capacity"] = self.cache.capacity
        s["cache_size"] = len(self.cache.by_name)
        s["fusion_threshold"] = self.tuning.fusion_threshold
        s["cycle_time_us"] = int(self.tuning.cycle_time * 1e6)
        return s

    def unusable_reason(self) -> str | None:
        """Why this engine cannot run the job's collectives any more (it failed, this or
        another rank has shut down), or None while it can."""
        if self._broken is not None:
            return f"has stopped ({self._broken})"
        if self._shutdown:
            return "is shutting down"
        if self.negotiator.quit:
            return f"lost rank(s) {sorted(self.negotiator.quit)}, which have shut down"
        return None

    def set_timeline(self, timeline: Timeline) -> None:
        """Record into ``timeline`` from now on (``hora.native.start_timeline``); the one
        recorded so far is written and closed."""
        old, self.timeline = self.timeline, timeline
        old.close()

    # -- the engine thread's helpers ----------------------------------------------------------
    def finish(self, req: Request, result: Any = None, error: BaseException | None = None) -> None:
        """Complete ``req``'s handle; callers are woken by :meth:`notify_done`."""
        h = req.handle
        if h is None:
            return
        if error is not None:
            h._error = error
        else:
            h._result = result
        self._completed.append(h)

    def finish_fused(self, reqs: list[Request], nbytes: int, fused: bool = True,
                     waiting: dict[str, Request] | None = None) -> None:
        """Complete allreduces whose results were copied out of one fused collective of
        ``nbytes`` (or, ``fused=False``, reduced in place by it), and count it; remove
        them from ``waiting`` when given."""
        append = self._completed.append
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
        self._count_allreduce(len(reqs), nbytes, fused)

    def _count_allreduce(self, tensors: int, nbytes: int, fused: bool) -> None:
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
        if not self._caller_round:
            self._finish_later(reqs, results)
        else:
            wpop = self._waiting.pop
            npop = self._names.pop
            with self._lock:
                for q, r in zip(reqs, results):
                    name = q.name
                    wpop(name, None)
                    npop(name, None)
                    q._result = r
                    q._done = True
            with self._done_cond:
                self._done_cond.notify_all()
        self._count_allreduce(len(reqs), nbytes, fused)

    def _finish_later(self, reqs: list[Request], results: list[Any]) -> None:
        wpop = self._waiting.pop
        append = self._completed.append
        for q, r in zip(reqs, results):
            wpop(q.name, None)
            q._result = r
            append(q)

    def notify_done(self) -> None:
        """Mark the completed handles done and wake their callers."""
        done, self._completed = self._completed, []
        if not done:
            return
        pop = self._names.pop
        with self._lock:
            for h in done:
                pop(h.name, None)
                h._done = True
        with self._done_cond:
            self._done_cond.notify_all()

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

    # -- shutting down ------------------------------------------------------------------------
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
            if self._offer.gathering:
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
        self.executor.release()
