"""The :class:`Engine`: submission from any thread, handles, shutdown and release.

The engine owns its :class:`~.state.EngineState` and the parts that work on it: the
background thread's :class:`~.loop.RoundLoop`, the :class:`~.execute.Executor`, the
:class:`~.speculation.Speculator` and the autotuner. This module is what callers touch:
:meth:`Engine.submit` enqueues a request and wakes the job, :meth:`Engine.request_flush`
lets a caller that blocks on a handle run a predicted round in its own thread, and
:meth:`Engine.shutdown` stops the engine collectively.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from hora.errors import CollectiveError, ConfigError
from hora.native.backends.base import Backend
from hora.native.engine.autotune import Autotuner
from hora.native.engine.config import ABORT_JOIN_TIMEOUT, ENV_SHUTDOWN_TIMEOUT, EngineConfig
from hora.native.engine.execute import Executor
from hora.native.engine.fusion import flat
from hora.native.engine.loop import RoundLoop
from hora.native.engine.request import Handle, Request
from hora.native.engine.speculation import STAGE_MIN_NUMEL, Speculator
from hora.native.engine.state import CLAIMED, NO_CLAIM, OFFERED, RAN, EngineState
from hora.native.timeline import Timeline

log = logging.getLogger(__name__)


class Engine:
    """Background negotiation and execution of collectives (one per process)."""

    def __init__(self, backend: Backend, config: EngineConfig | None = None, timeline: Timeline | None = None,
                 device_backend_factories: dict[str, Callable[[], Backend]] | None = None) -> None:
        config = config or EngineConfig()
        self.config = config
        self.rank = backend.rank
        self.size = backend.size
        self.state = st = EngineState(backend, config, timeline or Timeline(None, backend.rank),
                                      device_backend_factories)
        self.executor = Executor(st)
        self.speculator = Speculator(st, self.executor)
        self.autotuner = Autotuner(config.autotune_window) if config.autotune else None
        self.loop = RoundLoop(st, self.executor, self.speculator, self.autotuner)
        self._thread = threading.Thread(target=self.loop.run, name=f"hora-engine-{st.rank}", daemon=True)
        self._thread.start()

    @property
    def done_cond(self) -> threading.Condition:
        """The condition callers wait on for their handles (notified as ops complete)."""
        return self.state.done_cond

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
        st = self.state
        req._engine = self
        if st.timeline.enabled:
            req.t_submit = st.timeline.now()
        name = req.name
        with st.lock:
            if st.broken is not None:
                raise CollectiveError(f"the hora engine has stopped: {st.broken}") from st.broken
            if st.shutting_down:
                raise CollectiveError("hora is shutting down; no new collectives are accepted")
            if st.names.setdefault(name, req) is not req:
                raise ConfigError(
                    f"a collective named '{name}' is already in flight on rank {st.rank}; "
                    "wait for it (synchronize) before submitting the same name again"
                )
            st.incoming.append(req)
            offer = st.offer
            missing = offer.missing
            if missing is not None:
                try:
                    missing.remove(name)
                except KeyError:
                    if name not in offer.spec.name_set:
                        offer.foreign = True  # not predicted: negotiate it soon
                        st.gather_cond.notify()
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
                        st.gather_cond.notify()  # this rank now has the whole predicted round
            if st.idle and not st.woken:
                st.woken = True
                st.waker.signal(st.epoch)
        return req

    def poke(self) -> None:
        """Wake every rank's idle engine for one round (stall checks while callers wait)."""
        st = self.state
        with st.lock:
            if st.idle and not st.woken:
                st.woken = True
                st.waker.signal(st.epoch)

    def kick(self) -> None:
        """A caller polls a handle that is not done: when this rank holds the whole
        predicted round and nobody runs it yet, have the engine thread run it now (a
        deferred offer waits for a blocking caller: see ``RoundLoop.arm``)."""
        st = self.state
        offer = st.offer
        if offer.claim != OFFERED:
            return
        with st.lock:
            if offer.claim == OFFERED and offer.gathering:
                offer.defer = False
                st.gather_cond.notify()

    def request_flush(self, handle: Handle) -> None:
        """A caller is about to block on ``handle``: stop waiting for more submissions
        while it is pending (until :meth:`end_flush`). When the engine offers a predicted
        round (see ``RoundLoop._gather_predicted``), the caller runs it here, in its own
        thread, and then offers the next predicted round itself (running that one too
        while ``handle`` is still pending and this rank already holds all of it); the
        engine thread is woken only when it has to take over."""
        st = self.state
        offer = st.offer
        with st.lock:
            st.blocked.append(handle)
            if offer.claim != OFFERED:
                if offer.gathering:
                    st.gather_cond.notify()
                return
            offer.claim = CLAIMED
            args = offer.args
        while True:
            st.stats["rounds_run_by_caller"] += 1
            spec = args[2]
            # no autograd in the round (the caller may be anywhere): the grad-mode switch
            # itself, 0.7 us, where torch.no_grad()'s context costs 1.9 us
            grad = torch.is_grad_enabled()
            if grad:
                torch._C._set_grad_enabled(False)
            st.caller_round = True
            try:
                result: Any = self.loop.round_body(*args)
            except BaseException as exc:  # noqa: BLE001 - the engine thread raises it
                result = exc
            finally:
                st.caller_round = False
                if grad:
                    torch._C._set_grad_enabled(True)
            with st.lock:
                spec.unclaimed = 0
                spec.claimed += 1
                nxt = self.speculator.spec
                if result is True and nxt is not None and not st.shutting_down and not st.aborted:
                    self.loop.arm(nxt, *self.loop.begin_round())
                    if offer.claim == OFFERED and not handle._done:
                        offer.claim = CLAIMED  # the next round is complete here too: run it
                        args = offer.args
                        continue
                    if offer.claim == OFFERED or st.flush:
                        st.gather_cond.notify()  # the engine thread runs it, or waits for the rest
                    return
                offer.result = result
                offer.claim = RAN  # the engine thread takes the loop back
                st.gather_cond.notify_all()
                return

    def end_burst(self) -> None:
        """The caller has submitted a complete group (a bucket of gradients): negotiate
        what is gathered now instead of waiting for the burst to settle."""
        st = self.state
        with st.lock:
            offer = st.offer
            offer.burst_end = True
            if offer.gathering and offer.spec is None:  # (a predicted round waits for its names)
                st.gather_cond.notify()

    def end_flush(self, handle: Handle) -> None:
        """The caller of :meth:`request_flush` stopped blocking."""
        st = self.state
        with st.lock:
            st.blocked.remove(handle)

    # -- what callers ask ---------------------------------------------------------------------
    def room_elements(self) -> int:
        """Spare elements a tensor's ``room`` needs after it: the largest control tail, and
        one "holds it" count per rank (see :mod:`.speculation`)."""
        st = self.state
        return st.control.max_tail() + st.size

    def supports_device(self, device: str) -> bool:
        """Whether tensors on ``device`` ("cpu", "cuda") can be communicated."""
        return self.state.supports_device(device)

    def describe_waiting(self, name: str) -> str:
        """Best-effort text naming the ranks that have (not) submitted ``name``."""
        st = self.state
        return st.negotiator.describe_waiting(name)

    def engine_stats(self) -> dict[str, int]:
        st = self.state
        s = dict(st.stats)
        s["cache_capacity"] = st.cache.capacity
        s["cache_size"] = len(st.cache.by_name)
        s["fusion_threshold"] = st.tuning.fusion_threshold
        s["cycle_time_us"] = int(st.tuning.cycle_time * 1e6)
        return s

    def unusable_reason(self) -> str | None:
        """Why this engine cannot run the job's collectives any more (it failed, this or
        another rank has shut down), or None while it can."""
        st = self.state
        if st.broken is not None:
            return f"has stopped ({st.broken})"
        if st.shutting_down:
            return "is shutting down"
        if st.negotiator.quit:
            return f"lost rank(s) {sorted(st.negotiator.quit)}, which have shut down"
        return None

    def set_timeline(self, timeline: Timeline) -> None:
        """Record into ``timeline`` from now on (``hora.native.start_timeline``); the one
        recorded so far is written and closed."""
        st = self.state
        old, st.timeline = st.timeline, timeline
        old.close()

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
        st = self.state
        with st.lock:
            st.shutting_down = True
            if st.offer.gathering:
                st.gather_cond.notify()
            st.wake_locked()
        self._thread.join(st.config.shutdown_timeout)
        if self._thread.is_alive():
            log.warning("rank %d: the hora engine did not stop within %gs (%s); leaving without the other ranks "
                        "(raise %s to wait longer)", st.rank, st.config.shutdown_timeout,
                        "collectives still in flight here" if st.names else "other ranks have not shut down",
                        ENV_SHUTDOWN_TIMEOUT)
            self._abort(CollectiveError(f"rank {st.rank}: hora was shut down with collectives in flight"))
            self._thread.join(ABORT_JOIN_TIMEOUT)
        st.timeline.close()
        ended = not self._thread.is_alive()
        if ended:
            st.waker.close()
        return ended

    def _abort(self, exc: CollectiveError) -> None:
        """Give up on the other ranks: fail every handle, make the thread leave at its next
        chance, and interrupt the backend call it may be blocked in."""
        st = self.state
        with st.lock:
            st.aborted = True
            if st.broken is None:
                st.broken = exc  # no new submissions
            st.gather_cond.notify_all()
            st.woken = False
            st.wake_locked()
            reqs = list(st.names.values())
        # fail the handles, but leave the engine's tables to its thread (it may be using them)
        st.fail_handles(reqs, exc)
        groups = [g for info in st.process_sets.values() for g in info.device_groups.values()]
        for be in list(st.device_backends.values()):
            try:
                be.interrupt([g for g in groups if g is not None])
            except Exception as err:  # best effort: the call ends at its timeout instead
                log.debug("rank %d: interrupting %s failed: %s", st.rank, be.name, err)

    def on_exit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the engine thread has ended (now, if it has): releasing the
        backend must wait until no thread can be inside one of its calls."""
        self.loop.on_exit(fn)

    def release(self) -> None:
        """Release every group of every process set and every backend (call it once the
        thread has ended: see :meth:`on_exit`)."""
        st = self.state
        for info in list(st.process_sets.values()):
            for dev, g in list(info.device_groups.items()):
                be = st.device_backends.get(dev, st.backend)
                if g is None or g is be.world:
                    continue  # the world group goes with its backend
                try:
                    be.destroy_group(g)
                except Exception as exc:
                    log.debug("rank %d: releasing process set %d on %s failed: %s", st.rank, info.id, dev, exc)
        st.process_sets.clear()
        for dev, be in list(st.device_backends.items()):
            try:
                be.shutdown()
            except Exception as exc:
                log.warning("rank %d: shutting down the %s backend failed: %s", st.rank, be.name, exc)
        st.device_backends.clear()
        self.executor.release()
