"""Agreed responses and the response cache (identical on every rank).

A name every rank of its process set submitted alike becomes a :class:`Response`; a
cacheable one is then kept in the :class:`ResponseCache` under a *slot*: the next time
every rank submits it, one bit per rank in the round's control vector is all the
negotiation it needs. The cache is only changed by the round's deterministic
bookkeeping, from job-wide results, so every rank's cache is the same.
"""

from __future__ import annotations

import collections
from typing import Any

from hora.native.engine.request import ALLREDUCE, OpKey, Request, itemsize, numel_of


class Response:
    """An agreed op, identical on every rank. Sizes and the fusion key are precomputed."""

    __slots__ = ("name", "key", "locals", "error", "seq", "extra_result", "kind", "ps_id", "numel", "nbytes",
                 "fkey")

    def __init__(self, name: str, key: OpKey | None, locals_: dict[int, Any] | None, error: str | None = None,
                 seq: int = 0, extra_result: Any = None) -> None:
        self.name = name
        self.key = key
        self.locals = locals_
        self.error = error
        self.seq = seq
        self.extra_result = extra_result
        if key:
            self.kind = key.kind
            self.ps_id = key.process_set
            self.numel = numel_of(key.shape) if key.kind == ALLREDUCE else 0
            self.nbytes = self.numel * itemsize(key.dtype) if key.dtype else 0
            # allreduces fuse when these agree
            self.fkey = (key.dtype, key.op, key.process_set, key.prescale_factor, key.postscale_factor,
                         key.compression, key.device)
        else:
            self.kind = ""
            self.ps_id = 0
            self.numel = self.nbytes = 0
            self.fkey = None


class CacheEntry(Response):
    """A cached response; its ``slot`` is its bit in the negotiation's control vector."""

    __slots__ = ("slot",)

    def __init__(self, slot: int, name: str, key: OpKey, locals_: dict[int, Any]) -> None:
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
        self._lru_moves = 0  # bumped whenever the LRU order may change (see touch_all)
        self._touched: tuple[Any, int] | None = None  # (owner, _lru_moves) of the last touch_all
        self._used_version = -1
        self._used = 0

    def lookup(self, req: Request, rank: int) -> CacheEntry | None:
        """The entry ``req`` matches on this rank (same name, key and local data), or None."""
        e = self.by_name.get(req.name)
        if e is not None and e.key == req.key and e.locals.get(rank) == req.local:
            return e
        return None

    def valid(self, e: CacheEntry) -> bool:
        return self.slots[e.slot] is e

    def erase(self, name: str) -> None:
        e = self.by_name.pop(name, None)
        if e is not None:
            self._lru_moves += 1
            self.version += 1
            self.evictions += 1
            self.slots[e.slot] = None
            self.lru.pop(e.slot, None)
            self.free.append(e.slot)

    def touch(self, e: CacheEntry) -> None:
        self._lru_moves += 1
        self.lru.move_to_end(e.slot)

    def touch_all(self, slots: list[int], owner: Any = None) -> None:
        """Make ``slots`` the most recently used, in this order. ``owner`` (a predicted
        round, whose slots are the same every step): when it did exactly this last and
        nothing moved since, the order is already that and nothing is done (a training
        loop's steady state, a thousand moves a round otherwise)."""
        if owner is not None and self._touched is not None and self._touched[0] is owner \
                and self._touched[1] == self._lru_moves:
            return
        self._lru_moves += 1
        move = self.lru.move_to_end
        for slot in slots:
            move(slot)
        self._touched = (owner, self._lru_moves) if owner is not None else None

    def put(self, name: str, key: OpKey, locals_: dict[int, Any]) -> None:
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
        self._lru_moves += 1
        slot = self.free.pop()
        e = CacheEntry(slot, name, key, locals_)
        self.slots[slot] = e
        self.by_name[name] = e
        self.lru[slot] = None

    def slots_in_use(self) -> int:
        """One past the highest slot in use (identical on every rank)."""
        if self._used_version != self.version:
            self._used_version = self.version
            self._used = max((e.slot for e in self.by_name.values()), default=-1) + 1
        return self._used
