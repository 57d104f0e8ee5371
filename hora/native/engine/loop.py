"""The background loop: idle waits, rounds, and what follows a round.

While the job has outstanding work every rank's thread runs *rounds* in lockstep; a
round is itself a collective: a ``MIN`` allreduce of the control vector
(:mod:`.control`), then, only when some rank has requests the cache does not know, an
allgather of their metadata (:mod:`.negotiation`). Every rank then derives the same
ready responses, runs them (:mod:`.execute`), and decides alike whether another round
follows or the job goes idle (:meth:`RoundLoop._after_round`). An idle thread blocks on
a job-wide wake-up signal that the next submission anywhere sets. A predicted round
(:mod:`.speculation`) is waited for locally instead, and may run in the thread of a
caller that blocks on a handle (:meth:`RoundLoop._gather_predicted`), which then offers
the next predicted round itself (:meth:`RoundLoop.arm`): in a training loop's steady
state the thread sleeps while the callers run the rounds, with no hand-over per round.

:class:`RoundLoop` works on the engine's :class:`~.state.EngineState` with the engine's
executor and speculator, which the :class:`~.engine.Engine` hands it; what only the
thread needs (the round count, the quiet rounds, the quit handshake) is its own.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable

import torch

from hora.errors import CollectiveError
from hora.native.backends.base import ReduceOp
from hora.native.engine import negotiation
from hora.native.engine.autotune import Autotuner
from hora.native.engine.cache import Response
from hora.native.engine.config import IDLE_POLL
from hora.native.engine.control import I32_MAX, Vote
from hora.native.engine.request import ALLREDUCE, JOIN, QUIT, QUIT_KEY, UNCACHEABLE, is_one_off
from hora.native.engine.execute import Executor
from hora.native.engine.speculation import HIT, ONE_OFF, PURE_HIT, Spec, Speculator
from hora.native.engine.state import CLAIMED, NO_CLAIM, OFFERED, RAN, EngineState

log = logging.getLogger(__name__)

DEFER_AFTER = 2  # a round blocking callers ran this many times in a row is offered without waking the thread
DEFER_POLL = 0.02  # seconds: how long the thread then sleeps at most before it looks (see RoundLoop.arm)


class RoundLoop:
    """The engine thread's rounds over ``state`` (:meth:`run` is the thread's body); a
    blocking caller runs a predicted round through :meth:`round_body` and offers the
    next one with :meth:`arm` (see ``Engine.request_flush``)."""

    def __init__(self, state: EngineState, executor: Executor, speculator: Speculator,
                 autotuner: Autotuner | None) -> None:
        self.state = state
        self.executor = executor
        self.speculator = speculator
        self.autotuner = autotuner
        self._round_no = 0
        self._quiet_rounds = 0
        self._to_forget: list[int] = []
        self._nm_key: tuple = ()
        self._nm_slots: list[int] = []
        self._t_start = time.monotonic()
        self._quit_announced = False  # this rank, done, asked for the round that may end the job
        self._quit_sent = False  # this rank told the others it shut down (QUIT metadata)
        self._all_quit = False
        self._exit_lock = threading.Lock()
        self._exited = False  # the thread has ended
        self._on_exit: list[Callable[[], None]] = []

    def on_exit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the thread has ended (now, if it has)."""
        with self._exit_lock:
            if not self._exited:
                self._on_exit.append(fn)
                return
        fn()

    def run(self) -> None:
        st = self.state
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
                log.exception("rank %d: the hora engine failed", st.rank)
                exc = CollectiveError(f"rank {st.rank}: the hora engine failed: {exc!r}")
            self._fail_all(exc)
        finally:
            with self._exit_lock:
                self._exited = True
                callbacks, self._on_exit = self._on_exit, []
            for fn in callbacks:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - the thread is ending; say so and go on
                    log.exception("rank %d: releasing the hora engine failed", st.rank)

    def _fail_all(self, exc: BaseException) -> None:
        st = self.state
        with st.lock:
            if st.broken is None:
                st.broken = exc
            reqs = list(st.names.values())
            st.names.clear()
            st.incoming.clear()
            st.waiting.clear()
        st.fail_handles(reqs, exc)

    def _active_wait(self) -> bool:
        """Block while the whole job is idle. False: shut down."""
        st = self.state
        with st.lock:
            st.idle = True
            st.woken = False
            if st.aborted:
                return False
            if st.shutting_down:
                if st.size == 1:
                    if not st.names:
                        return False
                elif not self._quit_sent or (not st.names and not self._quit_announced):
                    # a round tells every rank that this one has shut down; once it has
                    # nothing in flight, one more may be the round in which every rank
                    # is done (the engine keeps answering rounds until then)
                    self._quit_announced = not st.names
                    st.woken = True
                    st.waker.signal(st.epoch)
            if st.incoming and not st.woken:
                st.woken = True
                st.waker.signal(st.epoch)
        if self._to_forget and (not st.woken or len(self._to_forget) > 64):
            # this rank's wake-up keys of epochs it has left (one store call each): done
            # while nothing waits, so a burst of ops does not pay for them
            forget, self._to_forget = self._to_forget, []
            for e in forget:
                st.waker.forget(e)
        while True:
            try:
                woken = st.waker.wait(st.epoch, IDLE_POLL)
            except Exception as exc:
                with st.lock:
                    if st.shutting_down:
                        return False
                raise CollectiveError(
                    f"rank {st.rank}: lost the job's coordination store while idle ({exc}); "
                    "did another rank exit or crash?"
                ) from None
            with st.lock:
                if st.aborted:
                    return False
                if woken:
                    st.idle = False
                    return True

    def _nonmember_slots(self) -> list[int]:
        """Cache slots of ops whose process set this rank is not a member of."""
        st = self.state
        key = (st.cache.version, st.ps_version)
        if key != self._nm_key:
            self._nm_key = key
            pss = st.process_sets
            self._nm_slots = [e.slot for e in st.cache.by_name.values()
                              if e.ps_id and (e.ps_id not in pss or not pss[e.ps_id].group.is_member)]
        return self._nm_slots

    def _now_ms(self) -> int:
        return int((time.monotonic() - self._t_start) * 1000)

    def begin_round(self) -> tuple[float, float]:
        """Count a round and stamp its start (the round's ``t0`` and timeline ``tl0``)."""
        st = self.state
        self._round_no += 1
        st.stats["rounds"] += 1
        return time.perf_counter(), (st.timeline.now() if st.timeline.enabled else 0.0)

    def _round(self) -> bool:
        """One negotiation round (+ execution). Returns False when the job went idle."""
        st = self.state
        if st.aborted:
            raise CollectiveError(f"rank {st.rank}: hora was shut down without the other ranks")
        t0, tl0 = self.begin_round()
        cycle = st.tuning.cycle_time
        spec = self.speculator.spec
        offer = st.offer
        with st.lock:
            if spec is not None:
                args = self._gather_predicted(spec, t0, tl0)
                if args is None:
                    # callers that blocked on handles ran the predicted rounds in their own
                    # threads, and handed the loop back with the last round's result
                    result, offer.result = offer.result, None
                    if isinstance(result, BaseException):
                        raise result
                    return bool(result)
                t0, tl0, spec = args
            elif st.incoming and not st.flush and not offer.burst_end and cycle > 0:
                # let a burst of submissions (a backward pass, a loop of allreduce_async)
                # land before negotiating, instead of competing with it for the GIL
                offer.gathering = True
                deadline = time.monotonic() + 10 * cycle
                seen = len(st.incoming)
                while not st.flush and not st.shutting_down and not offer.burst_end:
                    st.gather_cond.wait(cycle)
                    n = len(st.incoming)
                    if n == seen or time.monotonic() >= deadline:
                        break
                    seen = n
                offer.gathering = False
        return self.round_body(t0, tl0, spec)

    def round_body(self, t0: float, tl0: float, spec: Spec | None) -> bool:
        """The round after its gather: negotiate, execute, decide what comes next."""
        st = self.state
        if st.aborted:
            raise CollectiveError(f"rank {st.rank}: hora was shut down without the other ranks")
        cache = st.cache
        cv = st.control
        C = cache.capacity
        neg = st.negotiator
        with st.lock:
            st.offer.burst_end = False
            fresh, st.incoming = st.incoming, []
        waiting = st.waiting
        by_name = cache.by_name
        me = st.rank
        bits: list[int] = []
        uncached: list[negotiation.Metadata] = []
        slots = cache.slots
        exact = (spec is not None and spec.entries is not None and not waiting and spec.version == cache.version
                 and spec.matches(fresh, me))
        exact_reqs = None
        if exact:
            # the steady state of a training loop: this rank submitted exactly the predicted
            # ops, in their order, and has nothing else pending (see Spec.matches)
            waiting.update(zip(spec.names, fresh))
            bits = list(spec.slots)
            exact_reqs, fresh = fresh, []
            st.stats["rounds_matched_whole"] += 1
        # still pending from earlier rounds: re-check their slots
        rest = [] if exact else list(waiting.values())
        for req in fresh:
            waiting[req.name] = req
            if C:
                e = by_name.get(req.name)
                if e is not None and e.locals.get(me) == req.local and (e.key is req.key or e.key == req.key):
                    # the entry keeps the submit path's key object (one per shape), so the
                    # next rounds match by identity: comparing two 12-field keys costs more
                    # than the rest of the match (the entry's came from the round's metadata)
                    e.key = req.key
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
                    neg.my_join_round = self._round_no
        if st.shutting_down and not self._quit_sent:
            self._quit_sent = True  # from now on nothing new comes from this rank: say so
            uncached.append((f"{QUIT}.{me}", QUIT_KEY, None))
        if neg.my_join_round is not None and neg.my_join_round < self._round_no and C:
            # a joined rank stands in (with zeros) for every cached allreduce of its sets
            for e in cache.by_name.values():
                ps = st.process_sets.get(e.ps_id)
                if e.kind == ALLREDUCE and ps is not None and st.rank in ps.ranks:
                    bits.append(e.slot)
        payload = pickle.dumps(uncached, protocol=pickle.HIGHEST_PROTOCOL) if uncached else b""
        tuner = self.autotuner
        vote = Vote(bits, self._nonmember_slots() if C else [], bool(uncached), len(payload),
                    bool(st.waiting or uncached), self._now_ms(),
                    tuner.index if (tuner is not None and st.rank == 0) else I32_MAX,
                    st.shutting_down and not st.names, st.config.speculate and tuner is None)
        spec_ok = False
        spx = self.speculator
        if spec is not None and spec.piggyback:
            outcome, ctrl = spx.collective(spec, vote, exact_reqs)
            if outcome == PURE_HIT:
                return self._end_pure_round(t0, tl0, spec)
            spec_ok = outcome == HIT
            if exact_reqs is not None and not spec_ok:
                # still pending: their entries, as the per-request match gives them
                for req, e in zip(exact_reqs, spec.entries):
                    req.entry = e
        else:
            ctrl = cv.encode(*vote)
            st.backend.allreduce(torch.from_numpy(ctrl), ReduceOp.Min, st.backend.world)
        flags = cv.flags(ctrl)
        spx.allowed = flags.speculate
        if tuner is not None:
            change = tuner.proposal(flags.tune)  # rank 0's choice, so grouping agrees everywhere
            if change is not None:
                st.tuning.fusion_threshold, st.tuning.cycle_time = change
        if flags.all_done:
            self._all_quit = True  # every rank has shut down with nothing in flight
            return False
        if not flags.any_work:
            spx.spec = None  # (a predicted round nobody had anything for)
            return self._after_round(t0, False, False)
        evictions = cache.evictions
        now = flags.now_ms
        ready_entries = [slots[s] for s in cv.ready_slots(ctrl)]
        partial = cv.partial_slots(ctrl)

        errors: dict[str, str] = {}
        new_ready: list[Response] = []
        if flags.any_uncached:
            metas = negotiation.exchange(st.backend, payload, flags.max_payload)
            st.stats["negotiation_bytes"] += (flags.max_payload + 4) * st.size
            if neg.process_metas(metas, now, self._round_no, new_ready, errors):
                spx.learn(None)  # a rank shut down: what was predicted cannot come
        st.stalls.check(now, partial, errors)

        responses: list[Response] = [e for e in ready_entries if e is not None]
        if responses:
            cache.touch_all([e.slot for e in responses])
        st.stats["cache_hits"] += len(responses)
        plan_key = cv.ready(ctrl).tobytes()
        round_bits = plan_key
        if spec_ok:
            # the predicted responses were reduced by the negotiation's own collective
            done = spec.slot_set
            responses = [e for e in responses if e.slot not in done]
            if responses:
                rest_bits = cv.ready(ctrl).copy()
                rest_bits[spec.slots] = 0
                plan_key = rest_bits.tobytes()
        new_ready.sort(key=lambda r: r.seq)
        responses.extend(new_ready)
        st.stats["cache_misses"] += sum(1 for r in new_ready if r.error is None and r.kind not in UNCACHEABLE)
        if st.timeline.enabled:
            st.timeline.cycle(tl0, st.timeline.now(), round=self._round_no, responses=len(responses))

        for name, msg in errors.items():
            req = st.waiting.pop(name, None)
            if req is not None:
                st.finish(req, error=CollectiveError(msg))
        try:
            if responses and not new_ready and not st.timeline.enabled and not neg.joined:
                # steady state: only cached responses; reuse the execution plan of the
                # last round with exactly these bits
                self.executor.run_planned(plan_key, responses)
            elif responses:
                self.executor.execute(responses)
                if C:
                    for r in new_ready:  # (a name made up for an unnamed op never comes again)
                        if r.error is None and r.kind not in UNCACHEABLE and not is_one_off(r.name):
                            cache.put(r.name, r.key, r.locals)
        finally:
            st.notify_done()
        if tuner is not None and st.rank == 0:
            tuner.observe(responses)
        # the chain of predicted rounds: a round that negotiated by name starts it over,
        # unless all it negotiated were unnamed ops (a metric's allreduce or a barrier
        # between steps): those never come again, so the chain goes on through them
        one_offs = bool(new_ready) and all(is_one_off(r.name) and r.kind not in UNCACHEABLE for r in new_ready)
        if errors or (new_ready and not one_offs):
            spx.learn(None)
        elif len(responses) > len(new_ready) or spec_ok:
            spx.learn(round_bits)
        elif one_offs:
            spx.learn(ONE_OFF)
        elif spec is not None:
            spx.spec = None  # predicted, and nothing came: wait through the store again
        return self._after_round(t0, bool(responses or errors), cache.evictions != evictions)

    def arm(self, spec: Spec, t0: float, tl0: float) -> None:
        """(Under the lock.) Offer the predicted round ``spec`` (started at ``t0``/``tl0``):
        what this rank still misses of it, and, when nothing, that it can run now.

        When blocking callers ran this round the last :data:`DEFER_AFTER` times (the last
        bucket of a backward pass, which ``optimizer.step()`` waits for right after), the
        submission that completes it does not wake the thread: the caller that blocks on
        it runs it, and the thread looks on its own every :data:`DEFER_POLL` seconds (or
        when a caller polls a handle), so a program that stops blocking still progresses."""
        st = self.state
        offer = st.offer
        names = st.names
        missing = set(spec.name_set)
        if names:
            missing.difference_update(names)
        offer.args = (t0, tl0, spec)
        offer.claim = NO_CLAIM if missing else OFFERED
        offer.missing = missing
        offer.spec = spec
        offer.stage = (self.speculator.stage_buffer(spec) if missing and spec.stages and spec.piggyback
                       and not spec.inplace else None)
        offer.foreign = bool(st.incoming) and any(r.name not in spec.name_set for r in st.incoming)
        offer.gen += 1
        offer.armed_at = time.monotonic()
        offer.defer = spec.claimed >= DEFER_AFTER
        offer.gathering = True

    def _gather_predicted(self, spec: Spec, t0: float, tl0: float) -> tuple | None:
        """(Under the lock.) Wait until this rank has submitted every tensor of the
        predicted round, a caller blocks on a handle, or shutdown; returns the round this
        thread runs now (``(t0, tl0, spec)``), or None: callers ran the predicted rounds
        and handed the loop back (``offer.result``).

        Once this rank holds the whole prediction the round is *offered*: a caller that
        blocks on a handle (``request_flush``) runs it in its thread, as DDP's hooks
        launch their reductions, sparing two hand-overs between threads. Nobody claims
        it within one cycle: this thread runs it (and after two such rounds in a row it
        stops offering that round, trying again every 16th time). A caller that ran a
        round offers the next predicted one itself (:meth:`_arm`), so in the steady state
        of a training loop this thread sleeps through the rounds; it takes over when the
        prediction ends, a round fails, or no caller takes an offer.
        """
        st = self.state
        offer = st.offer
        if st.flush or st.shutting_down:
            return t0, tl0, spec
        self.arm(spec, t0, tl0)
        # a rank may never submit the predicted tensors (its program went elsewhere): the
        # round then starts after the stall poll interval, so stall checks still run
        poll = st.config.stall_poll or IDLE_POLL
        settle = 10 * st.tuning.cycle_time
        cond = st.gather_cond
        try:
            while True:
                gen = offer.gen
                spec = offer.spec
                deadline = offer.armed_at + poll
                while (offer.missing and not st.flush and not st.shutting_down and offer.claim == NO_CLAIM
                       and offer.gen == gen):
                    now = time.monotonic()
                    if offer.foreign:  # something unpredicted is pending: gather it briefly, go
                        deadline = min(deadline, now + settle)
                        offer.foreign = False
                    left = deadline - now
                    if left <= 0:
                        break
                    cond.wait(min(left, DEFER_POLL) if offer.defer else left)
                if offer.gen != gen:
                    continue
                if offer.claim == OFFERED and not st.shutting_down and spec.should_offer():
                    grace = time.monotonic() + st.tuning.cycle_time
                    while offer.claim == OFFERED and not st.shutting_down and offer.gen == gen:
                        left = grace - time.monotonic()
                        if left <= 0:
                            # nobody blocked on it in time (say, the first bucket of a backward pass)
                            spec.unclaimed += 1
                            spec.claimed = 0
                            break
                        cond.wait(left)
                while offer.claim == CLAIMED and offer.gen == gen:
                    cond.wait(1.0)  # a caller runs it (and perhaps offers the next round)
                if offer.claim == RAN:
                    return None
                if offer.gen != gen:
                    continue
                spec.claimed = 0  # this thread runs it
                return offer.args
        finally:
            offer.claim = NO_CLAIM
            offer.args = None
            offer.missing = None
            offer.spec = None
            offer.stage = None
            offer.gathering = False
            offer.defer = False

    def _end_pure_round(self, t0: float, tl0: float, spec: Spec) -> bool:
        """The rest of a round whose prediction held with nothing else anywhere: exactly
        what the general path does for it (the cache's LRU order, stats, waking callers,
        learning), without decoding the control vector."""
        st = self.state
        self.speculator.allowed = True
        st.cache.touch_all(spec.slots, spec)
        stats = st.stats
        stats["cache_hits"] += len(spec.slots)
        stats["speculation_alone"] += 1
        if st.timeline.enabled:
            st.timeline.cycle(tl0, st.timeline.now(), round=self._round_no, responses=len(spec.slots))
        st.notify_done()
        self.speculator.learn(spec.bits)
        return self._after_round(t0, True, False)

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
        st = self.state
        self._quiet_rounds = 0 if progressed else self._quiet_rounds + 1
        joined = st.negotiator.joined
        if not evicted and not joined and self._quiet_rounds >= st.config.linger_rounds:
            self._quiet_rounds = 0
            if self.speculator.spec is not None:
                # every rank knows what comes next: each waits for its own part of it in
                # the next round's gather, with no wake-up through the store
                return True
            self._go_idle()
            return False
        left = st.tuning.cycle_time - (time.perf_counter() - t0)
        if left > 0:
            with st.lock:
                if not st.incoming and not st.flush:
                    st.offer.gathering = True
                    st.gather_cond.wait(left)  # a caller blocking on a handle ends it early
                    st.offer.gathering = False
        return True

    def _go_idle(self) -> None:
        st = self.state
        self._to_forget.append(st.epoch)  # this rank's key, deleted while idle
        st.epoch += 1
