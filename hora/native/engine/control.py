"""The control vector of a negotiation round: its layout, encoded and decoded in one place.

Every rank builds one per round and the ranks reduce them; every rank then decodes the
same job-wide vector, so a layout slip would be a cross-rank hang, not an exception.
Hence one class owns the layout, in two encodings:

* **MIN form** (int32, ``2C + 7`` elements for a cache of ``C`` slots), reduced with
  ``MIN`` by a normal round. Each slot is chosen so that the minimum means what the
  round needs: ``READY[s]`` is 1 on a rank that has submitted cached op ``s`` (or stands
  for it: a rank outside its process set, a joined rank), so the minimum says *every*
  rank has; ``MISSING[s]`` is its inverse on members, so a minimum of 0 says *some*
  rank has (for stall detection); then seven flags (:data:`FLAGS`).
* **Tail form** (float32/float64), the same information as *counts*, reduced with
  ``SUM`` when it rides at the end of a predicted round's data (a Sum allreduce): a
  count equal to the number of ranks is the minimum of 1. Only the slots in use travel;
  three more counts say whether the prediction held (:mod:`.speculation`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

I32_MAX = int(np.iinfo(np.int32).max)

#: the flags after the two slot sections, in order (MIN form)
FLAGS = ("no_uncached", "payload", "idle", "clock", "tune", "done", "speculate")


class RoundFlags(NamedTuple):
    """The job-wide flags of a round, decoded from a reduced MIN-form vector."""

    any_uncached: bool  # some rank sent metadata: the round allgathers it
    max_payload: int  # bytes of the longest metadata payload (an upper bound in tail form)
    any_work: bool  # some rank has something pending
    now_ms: int  # the job's clock for the stall checks (the same on every rank)
    tune: int  # rank 0's autotune candidate (I32_MAX: none)
    all_done: bool  # every rank has shut down with nothing in flight
    speculate: bool  # every rank allows predicted rounds


class Vote(NamedTuple):
    """What this rank says in a round (the arguments of :meth:`ControlVector.encode`)."""

    bits: list[int]  # the cached slots it has submitted
    nonmember: list[int]  # slots of process sets it is not in
    uncached: bool  # it sends metadata of requests the cache does not know
    payload: int  # bytes of that metadata
    has_work: bool  # it has something pending
    now_ms: int  # its clock
    tune: int  # rank 0's autotune candidate (I32_MAX: none)
    done: bool  # it has shut down with nothing in flight
    speculate: bool  # it allows predicted rounds


class ControlVector:
    """The layout for a response cache of ``capacity`` slots (the same on every rank)."""

    def __init__(self, capacity: int) -> None:
        C = self.capacity = capacity
        self.missing = C  # start of the MISSING section
        base = 2 * C
        self.no_uncached, self.payload, self.idle, self.clock, self.tune, self.done, self.speculate = (
            base + i for i in range(len(FLAGS)))
        self.size = base + len(FLAGS)

    # -- MIN form ------------------------------------------------------------------------
    def encode(self, bits: list[int], nonmember: list[int], uncached: bool, payload: int, has_work: bool,
               now_ms: int, tune: int, done: bool, speculate: bool) -> np.ndarray:
        """This rank's vote: ``bits`` are the cached slots it has submitted, ``nonmember``
        the slots of process sets it is not in (it votes "ready" for them, and not
        "have", so the members decide)."""
        C = self.capacity
        ctrl = np.zeros(self.size, dtype=np.int32)
        ctrl[C : 2 * C] = 1
        if bits:
            ctrl[bits] = 1
            ctrl[C : 2 * C] = 1 - ctrl[:C]
        if nonmember:
            ctrl[nonmember] = 1
        ctrl[self.no_uncached] = 0 if uncached else 1
        ctrl[self.payload] = -payload
        ctrl[self.idle] = 0 if has_work else 1
        ctrl[self.clock] = -now_ms
        ctrl[self.tune] = tune
        ctrl[self.done] = 1 if done else 0
        ctrl[self.speculate] = 1 if speculate else 0
        return ctrl

    def ready(self, ctrl: np.ndarray) -> np.ndarray:
        """The READY section (a view): 1 where every rank has the cached op."""
        return ctrl[: self.capacity]

    def ready_slots(self, ctrl: np.ndarray) -> list[int]:
        return np.flatnonzero(ctrl[: self.capacity] == 1).tolist() if self.capacity else []

    def partial_slots(self, ctrl: np.ndarray) -> np.ndarray:
        """Slots some rank has submitted but not every rank (candidates for a stall)."""
        C = self.capacity
        if not C:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero((ctrl[C : 2 * C] == 0) & (ctrl[:C] == 0))

    def flags(self, ctrl: np.ndarray) -> RoundFlags:
        return RoundFlags(
            any_uncached=ctrl[self.no_uncached] == 0, max_payload=int(-ctrl[self.payload]),
            any_work=ctrl[self.idle] == 0, now_ms=int(-ctrl[self.clock]), tune=int(ctrl[self.tune]),
            all_done=ctrl[self.done] == 1, speculate=ctrl[self.speculate] == 1)

    # -- tail form -----------------------------------------------------------------------
    def max_tail(self) -> int:
        """Elements of the longest tail (every slot in use), without the holders section."""
        return 2 * self.capacity + 8

    def encode_tail(self, ctrl: np.ndarray, used: int, dtype: type, *, rank: int, size: int, have: bool,
                    alone: bool, inplace: bool) -> np.ndarray:
        """The tail form of this rank's MIN-form ``ctrl``, carrying the first ``used``
        slots. ``have``: this rank holds the whole prediction; ``alone``: it has nothing
        else; ``inplace``: a holders section (one count per rank) follows."""
        C, U = self.capacity, used
        F = 2 * U
        tail = np.zeros(F + 8 + (size if inplace else 0), dtype=dtype)
        tail[:U] = ctrl[:U]  # ready votes (members that have it, and non-members)
        tail[U:F] = 1 - ctrl[C : C + U]  # members that have it
        tail[F] = 1 - ctrl[self.no_uncached]  # ranks with uncached requests
        tail[F + 1] = -(-int(-ctrl[self.payload]) // 1024)  # payload KiB, rounded up
        tail[F + 2] = 1 - ctrl[self.idle]  # ranks with work
        # rank 0's clock, in ms (exact in float32 for 4.6 hours, then to a few ms)
        tail[F + 3] = -ctrl[self.clock] if rank == 0 else 0
        tail[F + 4] = ctrl[self.done]  # ranks done (shutdown)
        tail[F + 5] = ctrl[self.speculate]  # ranks that allow speculation
        tail[F + 6] = 1 if have else 0  # ranks that hold the whole prediction
        tail[F + 7] = 1 if alone else 0  # ranks with nothing but the prediction
        if inplace and have:
            tail[F + 8 + rank] = 1  # which ranks hold the tensor
        return tail

    @staticmethod
    def tail_size(used: int, size: int, inplace: bool) -> int:
        """Elements of a tail that carries ``used`` slots (with the holders section)."""
        return 2 * used + 8 + (size if inplace else 0)

    def tail_of(self, vote: Vote, used: int, out: np.ndarray, *, rank: int, size: int, have: bool, alone: bool,
                inplace: bool, index: np.ndarray | None = None) -> None:
        """Write into ``out`` (:meth:`tail_size` elements) the tail form of ``vote``,
        exactly ``encode_tail(encode(*vote), ...)``, without making the MIN form (a
        predicted round that holds needs none). ``index``: ``vote.bits`` as an index
        array, all below ``used`` (a predicted round's slots, made once)."""
        U = used
        F = 2 * U
        flags = [1 if vote.uncached else 0, -(-vote.payload // 1024), 1 if vote.has_work else 0,
                 vote.now_ms if rank == 0 else 0, 1 if vote.done else 0, 1 if vote.speculate else 0,
                 1 if have else 0, 1 if alone else 0]
        if U <= 64:  # (the common case, a few slots: one conversion of a short list beats indexing)
            vals = [0] * F + flags + ([0] * size if inplace else [])
            for b in vote.bits:
                if b < U:
                    vals[b] = vals[U + b] = 1  # a ready vote; a member that has it
            for b in vote.nonmember:
                if b < U:
                    vals[b] = 1  # the ready vote of a non-member
            if inplace and have:
                vals[F + 8 + rank] = 1
            out[:] = vals
            return
        out[:] = 0
        if index is not None:
            out[index] = 1  # ready votes
            out[index + U] = 1  # members that have it
        elif vote.bits:
            bits = [b for b in vote.bits if b < U]
            out[bits] = 1  # ready votes
            out[[U + b for b in bits]] = 1  # members that have it
        if vote.nonmember:
            out[[b for b in vote.nonmember if b < U]] = 1  # ready votes of non-members
        out[F:F + 8] = flags
        if inplace and have:
            out[F + 8 + rank] = 1

    @staticmethod
    def tail_pure(out: np.ndarray, used: int, size: int) -> bool:
        """The prediction held and nothing else happened on any rank."""
        return out[2 * used + 7] == size

    @staticmethod
    def tail_held(out: np.ndarray, used: int, size: int) -> bool:
        """Every rank held the whole prediction."""
        return round(out[2 * used + 6]) == size

    @staticmethod
    def tail_holders(out: np.ndarray, used: int, size: int) -> np.ndarray:
        """The ranks that held the tensor of an in-place prediction."""
        F = 2 * used
        return np.flatnonzero(out[F + 8 : F + 8 + size] > 0.5)

    def decode_tail(self, out: np.ndarray, ctrl: np.ndarray, used: int, size: int) -> None:
        """Rewrite ``ctrl`` (MIN form) from a reduced tail ``out``: what a MIN reduction of
        the ranks' vectors would have given, but the autotune candidate (none) and the
        payload (an upper bound, whole KiB)."""
        C, U = self.capacity, used
        F = 2 * U
        np.equal(out[:U], size, out=ctrl[:U], casting="unsafe")
        ctrl[U:C] = 0
        np.equal(out[U:F], 0, out=ctrl[C : C + U], casting="unsafe")
        ctrl[C + U : 2 * C] = 1
        ctrl[self.no_uncached] = 0 if out[F] > 0 else 1
        ctrl[self.payload] = -int(round(out[F + 1])) * 1024
        ctrl[self.idle] = 0 if out[F + 2] > 0 else 1
        ctrl[self.clock] = -int(round(out[F + 3]))
        ctrl[self.tune] = I32_MAX
        ctrl[self.done] = 1 if round(out[F + 4]) == size else 0
        ctrl[self.speculate] = 1 if round(out[F + 5]) == size else 0
