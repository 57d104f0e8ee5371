"""Predicted rounds: a repeating round runs as one collective, its negotiation riding along.

Steady-state training repeats its rounds: every step the same gradients become ready
together. Every rank records, alike, which round (its cached-response bits) followed
which; once a successor has repeated :data:`SPEC_MIN_HITS` times, the next round is
*predicted* (:meth:`Speculator.learn`). A predicted round that is one fused
float32/float64 Sum/Average allreduce of the global set runs as ONE collective
(:meth:`Speculator.collective`): each rank waits until it holds every predicted tensor
(or a caller blocks, or it shuts down), packs them into the fusion buffer and appends
its control vector in tail form (:mod:`.control`), and one Sum allreduce reduces data
and negotiation together. When every rank held the whole prediction, the data part is
the result; otherwise it is discarded and the round continues as a normal one, from the
decoded control vector. Either way the same responses, errors, stall checks and cache
updates follow on every rank. A lone tensor with spare room after it (a
DistributedOptimizer bucket) is reduced in place instead (ranks without it send zeros);
after a miss the ranks that held it keep the partial sum on the lowest of them and
zeros on the others, so nothing is lost. Any other predicted round is only waited for
locally, then negotiated as a normal round. When every rank had nothing but the
prediction, a hit ends the round at once (``RoundLoop._end_pure_round``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hora.native.backends.base import ReduceOp
from hora.native.engine.control import Vote
from hora.native.engine.execute import Executor, scale_
from hora.native.engine.fusion import FusedGroup, FusionBuffers, flat, foreach_clone, unpack
from hora.native.engine.request import ALLREDUCE, ROOM, Request

if TYPE_CHECKING:
    from hora.native.engine.state import EngineState

SPEC_MIN_HITS = 2  # a successor seen this many times in a row is predicted
SPEC_SINGLE_MAX_BYTES = 1 << 20  # a predicted round of one tensor above this runs as a normal round
STAGE_MIN_NUMEL = 16384  # elements: a predicted tensor at least this big is staged at submit
MISS, HIT, PURE_HIT = range(3)  # outcomes of Speculator.collective
#: what Speculator.learn records for a round that negotiated only unnamed ops by name (a
#: metric's allreduce, a barrier between steps): a link of the chain that is never predicted
ONE_OFF = b"one-off"
CPU = torch.device("cpu")


class Spec:
    """A predicted round, identical on every rank: the cached ops every rank expects next
    (see :meth:`Speculator.make` for the three kinds)."""

    __slots__ = ("slots", "slot_set", "names", "name_set", "sizes", "numel", "dtype", "prescale", "postscale",
                 "average", "offsets", "_parts", "unclaimed", "claimed", "skipped", "piggyback", "inplace", "bits",
                 "shapes", "flat", "stages", "_room", "_fused", "entries", "keys", "slot_index", "version")

    def __init__(self, slots: list[int], names: list[str], sizes: list[int], dtype: torch.dtype | None,
                 prescale: float, postscale: float, average: bool, piggyback: bool = True,
                 inplace: bool = False, bits: bytes = b"") -> None:
        self.bits = bits  # the cached-response bits of the round predicted
        self.piggyback = piggyback  # False: only waited for locally, then a normal round
        self.inplace = inplace  # one tensor with room: reduced in place
        self.slots = slots
        self.slot_set = frozenset(slots)
        self.names = names
        self.name_set = frozenset(names)
        self.sizes = sizes
        self.numel = sum(sizes)
        self._parts: tuple[Any, list[torch.Tensor], list[torch.Tensor]] | None = None
        self.unclaimed = 0  # offers to a blocking caller in a row that nobody took
        self.claimed = 0  # rounds in a row a blocking caller ran (see RoundLoop.arm: deferred offers)
        self.skipped = 0  # rounds not offered since (see RoundLoop._gather_predicted)
        self.offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for name, n in zip(names, sizes):
            self.offsets[name] = (off, n)
            off += n
        self.dtype = dtype
        self.prescale = prescale
        self.postscale = postscale
        self.average = average
        self.shapes: list[tuple] | None = None  # the tensors' shapes (set by Speculator.make)
        self.flat = False  # every tensor is 1-D (copied in without views)
        self.stages = max(sizes, default=0) >= STAGE_MIN_NUMEL  # some tensor is copied in at submit
        self._room: tuple | None = None  # an in-place round's buffer and tail views, while the room stays
        self._fused: tuple | None = None  # the fusion buffer's views for this round (see fused_views)
        # (a round that runs as one collective) its cache entries and their keys, in the
        # order of ``names``, and its slots as an index array (see matches, collective)
        self.entries: list[Any] | None = None
        self.keys: list[Any] = []
        self.slot_index = np.asarray(slots, dtype=np.int64)
        self.version = -1  # the response cache's version the entries are from

    def keep_entries(self, by_name: dict[str, Any], version: int) -> None:
        """Keep this round's cache entries (``by_name``, of the cache at ``version``) in
        the order of its names, for :meth:`matches`."""
        self.entries = [by_name[n] for n in self.names]
        self.keys = [e.key for e in self.entries]
        self.version = version

    def matches(self, reqs: list[Request], rank: int) -> bool:
        """Whether ``reqs`` are exactly this round's ops, submitted in its order, each
        matching its cache entry (name, key, no per-rank data): the steady state of a
        training loop, recognized with a few comparisons of whole lists instead of a
        lookup per request (the keys compare by identity first, element by element)."""
        entries = self.entries
        if entries is None or len(reqs) != len(entries):
            return False
        if [q.name for q in reqs] != self.names:
            return False
        keys = [q.key for q in reqs]
        if keys != self.keys:
            return False
        if keys is not self.keys:
            # equal, but the entries' keys came from the round's metadata: keep the submit
            # path's objects instead, so the next rounds compare them by identity
            for e, k in zip(entries, keys):
                e.key = k
            self.keys = keys
        return [q.local for q in reqs].count(None) == len(reqs) and \
            all(e.locals.get(rank) is None for e in entries)

    def should_offer(self) -> bool:
        """Offer the round to a blocking caller, unless the last two offers went
        unclaimed; then offer again every 16th round (the caller may have sped up)."""
        if self.unclaimed < 2:
            return True
        self.skipped += 1
        if self.skipped >= 16:
            self.skipped = self.unclaimed = 0
        return False

    def parts_of(self, data: torch.Tensor, shapes: list[tuple] | None = None) -> list[torch.Tensor]:
        """Views of ``data`` (the fusion buffer's data part), one per tensor, kept while
        the buffer stays the same (splitting a thousand views costs more than a copy)."""
        key = (data.data_ptr(), data.numel())
        if self._parts is None or self._parts[0] != key:
            parts = list(data.split(self.sizes))
            shaped = parts if shapes is None or all(len(s) == 1 for s in shapes) else \
                [p.view(s) for p, s in zip(parts, shapes)]
            self._parts = (key, parts, shaped)
        return self._parts[1]

    def room_views(self, room: torch.Tensor, numel: int) -> tuple[torch.Tensor, np.ndarray]:
        """``room[:numel]`` and the tail's numpy view after the data (an in-place round),
        kept while the room and the tail's length stay the same (an optimizer bucket's
        buffer is reduced step after step)."""
        key = (room.data_ptr(), numel)
        got = self._room
        if got is None or got[0] != key:
            buf = room[:numel]
            got = self._room = (key, buf, buf[self.numel:].numpy())
        return got[1], got[2]

    def fused_views(self, buffers: FusionBuffers, tail: int, threshold: int) -> tuple[torch.Tensor, np.ndarray]:
        """The fusion buffer for this round's data and a ``tail`` of control elements,
        and the tail's numpy view, kept while the buffer underneath stays the same (a
        round reuses them step after step; making them costs more than the round's copy)."""
        base = buffers.base(self.dtype, CPU)
        got = self._fused
        if got is None or got[0] is not base or got[1] != tail or base is None:
            buf = buffers.get(self.dtype, self.numel + tail, CPU, threshold)
            got = self._fused = (buffers.base(self.dtype, CPU), tail, buf, buf[self.numel:].numpy())
        return got[2], got[3]

    def shaped_parts(self) -> list[torch.Tensor]:
        """The views of the last :meth:`parts_of`, with the tensors' shapes."""
        return self._parts[2]


class Speculator:
    """The successor table and the current prediction (the same on every rank: only
    changed from rounds' job-wide results)."""

    def __init__(self, state: EngineState, executor: Executor) -> None:
        self.state = state
        self.executor = executor
        self.spec: Spec | None = None  # the next round's prediction
        self.allowed = False  # every rank allowed speculation in the last round
        self._prev_bits: bytes | None = None
        self._succ: dict[bytes, list] = {}
        self._memo: dict[tuple, Spec | None] = {}  # predictions by bits and cache version
        self.stage_token = 1  # what a request staged at submit was staged for
        self.staged = 0  # requests staged for the next predicted collective (Engine.submit)

    def learn(self, bits: bytes | None) -> None:
        """Record that a round with cached-response ``bits`` followed the previous one
        (None: a round that negotiated by name; the chain starts over; :data:`ONE_OFF`: a
        round of unnamed ops only, which never repeat: the chain goes on through it, and
        when it is what comes next, nothing is predicted for that round) and predict the
        next round. Runs alike on every rank, from job-wide results only."""
        self.spec = None
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
        eng = self.state
        if nxt is None or nxt[1] < SPEC_MIN_HITS or not self.allowed or eng.negotiator.joined or nxt[0] == ONE_OFF:
            return
        version = (nxt[0], eng.cache.version, eng.ps_version, eng.tuning.fusion_threshold)
        memo = self._memo
        if version in memo:
            self.spec = memo[version]
        else:
            if len(memo) >= 64:
                memo.clear()
            self.spec = memo[version] = self.make(nxt[0])

    def make(self, bits: bytes) -> Spec | None:
        """The prediction for a round with ``bits``. When the round is one fused
        float32/float64 Sum/Average allreduce of the global set on the CPU, it runs as one
        collective (``piggyback``); any other predicted round is only waited for locally
        (no wake-up through the store) and then negotiated and run as a normal round."""
        eng = self.state
        C = eng.cache.capacity
        slots = np.flatnonzero(np.frombuffer(bits, dtype=np.int32)[:C]).tolist()
        entries = [eng.cache.slots[s] for s in slots]
        if not entries or None in entries:
            return None
        names = [e.name for e in entries]
        local = Spec(slots, names, [0] * len(names), None, 1.0, 1.0, False, piggyback=False, bits=bits)
        units = self.executor.plan(entries)
        if len(units) != 1 or type(units[0]) is not FusedGroup or len(units[0].resps) != len(entries):
            return local
        key = entries[0].key
        if (key.kind != ALLREDUCE or key.dtype not in ("float32", "float64") or key.process_set != 0
                or key.compression != "none" or key.device != "cpu"
                or ReduceOp(key.op) not in (ReduceOp.Sum, ReduceOp.Average)):
            return local
        unit = units[0]
        average = ReduceOp(key.op) == ReduceOp.Average
        dtype = getattr(torch, key.dtype)
        by_name = {e.name: e for e in entries}
        if len(unit.names) == 1 and key.extra == ROOM and key.prescale_factor == 1.0:
            # a lone tensor with spare room after it: reduced in place, the control vector in
            # the room (see collective() for why a miss loses nothing)
            spec = Spec(slots, unit.names, unit.sizes, dtype, key.prescale_factor, key.postscale_factor, average,
                        inplace=True, bits=bits)
            spec.keep_entries(by_name, eng.cache.version)
            return spec
        if len(unit.names) == 1 and unit.nbytes > SPEC_SINGLE_MAX_BYTES:
            # a lone tensor is reduced in place by a normal round; riding along with the
            # negotiation would copy it in and out of the fusion buffer, which costs more
            # than the negotiation's own small collective
            return local
        spec = Spec(slots, unit.names, unit.sizes, dtype, key.prescale_factor, key.postscale_factor, average,
                    bits=bits)
        spec.shapes = unit.shapes
        spec.flat = unit.flat
        spec.keep_entries(by_name, eng.cache.version)
        return spec

    def stage_buffer(self, spec: Spec) -> torch.Tensor:
        """Where a predicted tensor is copied when it is submitted (the fusion buffer's data part)."""
        eng = self.state
        return self.executor.buffer(spec.dtype, spec.numel + eng.control.max_tail(), torch.device("cpu"))[: spec.numel]

    def collective(self, spec: Spec, vote: Vote, exact: list[Request] | None = None) -> tuple[int, np.ndarray | None]:
        """Run the predicted round's data and this rank's ``vote`` (in tail form) as one
        Sum allreduce; return the outcome and the job-wide control vector (MIN form, as
        a normal round's reduction gives it). HIT when the prediction held on every rank
        (its requests are then finished), MISS when not; PURE_HIT when it held and
        nothing else happened anywhere (no control vector then: the engine ends the
        round at once). ``exact``: the round's requests, in its order, when they are all
        this rank has and its vote's bits are the round's slots, no more (see
        ``Spec.matches``)."""
        eng = self.state
        cv = eng.control
        size = eng.size
        n = spec.numel
        if exact is not None:
            have_bits: Any = spec.slot_set
            have = True
        else:
            have_bits = set(vote.bits)
            have = spec.slot_set <= have_bits
        # only the slots up to the highest one in use travel (the cache, so this bound, is
        # the same on every rank); a slot beyond it has no entry: nobody votes for it
        U = eng.cache.slots_in_use()
        inplace = spec.inplace
        # ranks with nothing but the prediction: no other op (so none ready or half-submitted
        # anywhere once every rank says so), nothing uncached, not done, speculation on, and
        # no stall tracking going on (job-wide state)
        alone = (have and len(have_bits) == len(spec.slots) and not vote.uncached and not vote.done
                 and vote.speculate and not eng.negotiator.table and not eng.stalls.tracking)
        T = cv.tail_size(U, size, inplace)
        reqs: list[Request] = []
        if exact is not None:
            reqs = exact
        elif have:
            waiting = eng.waiting
            reqs = [waiting[name] for name in spec.names]
        parts: list[torch.Tensor] = []
        out = None
        if inplace:
            # the tensor itself, the tail in its room; a rank without it sends zeros
            if have:
                buf, out = spec.room_views(reqs[0].room, n + T)
            else:
                buf = self.executor.buffer(spec.dtype, n + T, CPU)
                buf[:n].zero_()
        else:
            buf, out = spec.fused_views(self.executor.buffers, T, eng.tuning.fusion_threshold)
            data = buf[:n]
            token = self.stage_token
            self.stage_token += 1  # what was staged is consumed (or overwritten) by this collective
            staged, self.staged = self.staged, 0
            if have:
                parts = spec.parts_of(data, spec.shapes)
                todo = [i for i, q in enumerate(reqs) if q.staged != token] if staged else None
                if len(reqs) == 1 and not staged:
                    data.copy_(flat(reqs[0].tensor))
                elif todo is None or len(todo) == len(reqs):  # one batched copy
                    torch.cat([q.tensor for q in reqs] if spec.flat else [flat(q.tensor) for q in reqs], out=data)
                elif todo:
                    torch._foreach_copy_([parts[i] for i in todo], [flat(reqs[i].tensor) for i in todo])
                if spec.prescale != 1.0:
                    scale_(data, spec.prescale)
        if out is None:
            out = buf[n:].numpy()  # (the tail, written in place: the less runs around the collective, the better)
        cv.tail_of(vote, U, out, rank=eng.rank, size=size, have=have, alone=alone, inplace=inplace,
                   index=spec.slot_index if exact is not None else None)
        eng.backend.allreduce(buf, ReduceOp.Sum, eng.backend.world)
        st = eng.stats
        # float32 or float64: the counts are exact in either
        pure = cv.tail_pure(out, U, size)
        held = pure or cv.tail_held(out, U, size)
        ctrl = None
        if not pure:
            ctrl = np.empty(cv.size, dtype=np.int32)
            cv.decode_tail(out, ctrl, U, size)
        if not held:
            st["speculation_misses"] += 1
            if inplace and have:
                # Some rank did not have the tensor yet: this rank's tensor now holds the sum
                # over the ranks that had it (the others sent zeros). The lowest of those
                # ranks keeps that sum, the others zero their tensor, so the tensors of all
                # ranks still add up to the true sum, which the normal round that reduces
                # the tensor later (in place, prescale 1) produces.
                if eng.rank != int(cv.tail_holders(out, U, size)[0]):
                    buf[:n].zero_()
            return MISS, ctrl
        post = spec.postscale / size if spec.average else spec.postscale
        nbytes = n * buf.element_size()
        st["speculation_hits"] += 1
        if inplace:
            if post != 1.0:
                buf[:n].mul_(post)
            eng.complete_now(reqs, [q.output for q in reqs], nbytes, False)
            return (PURE_HIT if pure else HIT), ctrl
        if len(reqs) == 1 and reqs[0].output is None:  # one new tensor: no batched call for one
            q = reqs[0]
            res = data.mul(post) if post != 1.0 else data.clone()
            eng.complete_now(reqs, [res if spec.flat else res.view(q.tensor.shape)], nbytes, True)
            return (PURE_HIT if pure else HIT), ctrl
        if post != 1.0:
            # one pass over the fused data (the tail stays as reduced): a scale per
            # tensor while copying out costs a call per tensor, 3 us each
            data.mul_(post)
        outputs = [q.output for q in reqs]
        # (never ``count(None)`` or ``None in`` over tensors: each compares through torch)
        made = [o is None for o in outputs].count(True)
        shaped = spec.shaped_parts()
        if made == len(reqs):  # every one out of place: new tensors in one batched call
            results = foreach_clone(shaped)
        elif made == 0:  # every one in place
            torch._foreach_copy_(outputs, shaped)
            results = outputs
        else:
            unpack(parts, reqs, 1.0, shaped)
            results = [q.output for q in reqs]
        eng.complete_now(reqs, results, nbytes, True)
        return (PURE_HIT if pure else HIT), ctrl
