"""Negotiation by name: the table of names some ranks have submitted, joins, shutdowns.

Every rank runs the same bookkeeping on the same inputs (each round's allgathered
metadata, in rank order), so every rank derives the same ordered list of ready
responses and the same errors: a name is ready when every rank of its process set has
submitted it alike; keys that differ become one error naming the fields and the ranks,
delivered to every rank that submitted the name (and to those that submit it later:
the name is *poisoned* for them).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hora.native.backends.base import Backend, Group
from hora.native.engine.cache import Response, ResponseCache
from hora.native.engine.request import ALLREDUCE, JOIN, QUIT, OpKey, mismatch_message


class ProcessSetInfo:
    """Engine-side record of a registered process set."""

    def __init__(self, ps_id: int, ranks: Sequence[int], group: Group) -> None:
        self.id = ps_id
        self.ranks = list(ranks)
        self.group = group  # on the CPU backend
        self.device_groups: dict[str, Group] = {"cpu": group}


class Pending:
    """A name some ranks have submitted (replicated on every rank)."""

    __slots__ = ("name", "seq", "first", "keys", "locals", "rounds", "warned")

    def __init__(self, name: str, seq: int, first: int) -> None:
        self.name = name
        self.seq = seq
        self.first = first  # the job clock (ms) of the round it first appeared in
        self.keys: dict[int, OpKey] = {}
        self.locals: dict[int, Any] = {}
        self.rounds: dict[int, int] = {}
        self.warned = False


Metadata = tuple[str, OpKey, Any]  # (name, key, local data) of one uncached request


def exchange(backend: Backend, payload: bytes, maxlen: int) -> list[list[Metadata]]:
    """Allgather every rank's pickled metadata (``maxlen``: the longest payload)."""
    size = backend.size
    width = maxlen + 4
    buf = np.zeros(width, dtype=np.uint8)
    buf[:4] = np.frombuffer(struct.pack("!I", len(payload)), dtype=np.uint8)
    if payload:
        buf[4 : 4 + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    out = torch.empty(width * size, dtype=torch.uint8)
    backend.allgather(out, torch.from_numpy(buf), backend.world)
    raw = out.numpy().tobytes()
    metas = []
    for r in range(size):
        chunk = raw[r * width : (r + 1) * width]
        (n,) = struct.unpack("!I", chunk[:4])
        metas.append(pickle.loads(chunk[4 : 4 + n]) if n else [])
    return metas


class Negotiator:
    """The replicated table of pending names, and who has joined or shut down."""

    def __init__(self, rank: int, size: int, process_sets: dict[int, ProcessSetInfo], cache: ResponseCache) -> None:
        self.rank = rank
        self.size = size
        self.process_sets = process_sets  # the engine's (changed by process-set ops)
        self.cache = cache
        self.table: dict[str, Pending] = {}
        self.poisoned: dict[str, tuple[str, set[int]]] = {}  # name -> (error, ranks yet to submit it)
        self.joined: dict[int, int] = {}  # rank -> round its join arrived
        self.my_join_round: int | None = None
        self.quit: set[int] = set()  # ranks that have shut down (job-wide, from rounds' metadata)
        self.seq = 0

    def members(self, key: OpKey) -> list[int]:
        ps = self.process_sets.get(key.process_set)
        return ps.ranks if ps is not None else []

    def describe_waiting(self, name: str) -> str:
        """Best-effort text naming the ranks that have (not) submitted ``name``."""
        p = self.table.get(name)
        if p is None:
            return ""
        ps = self.process_sets.get(next(iter(p.keys.values())).process_set) if p.keys else None
        members = ps.ranks if ps else list(range(self.size))
        missing = [r for r in members if r not in p.keys]
        return f": submitted by ranks {sorted(p.keys)}, never by ranks {missing}"

    def process_metas(self, metas: list[list[Metadata]], now: int, round_no: int, ready: list[Response],
                      errors: dict[str, str]) -> bool:
        """Take in one round's metadata of every rank; append the responses that became
        ready to ``ready`` and this rank's errors to ``errors`` (name -> message).
        Returns True when a rank was newly seen to have shut down (the caller forgets
        its predictions)."""
        touched: dict[str, Pending] = {}
        joined_changed = False
        quit_before = len(self.quit)
        table = self.table
        cache = self.cache
        for r, lst in enumerate(metas):
            for name, key, local in lst:
                if key[0] == QUIT:
                    self.quit.add(r)
                    continue
                if cache.capacity:
                    cache.erase(name)
                poison = self.poisoned.get(name)
                if poison is not None:
                    if r == self.rank:
                        errors[name] = poison[0]
                    poison[1].discard(r)
                    if not poison[1]:
                        del self.poisoned[name]
                    continue
                p = table.get(name)
                if p is None:
                    self.seq += 1
                    p = table[name] = Pending(name, self.seq, now)
                p.keys[r] = key
                p.locals[r] = local
                p.rounds[r] = round_no
                touched[name] = p
                if key[0] == JOIN:
                    self.joined[r] = round_no
                    joined_changed = True
        quit_changed = len(self.quit) != quit_before
        if quit_changed:
            # cached ops that need a rank that shut down would never become ready: drop
            # them, so that their requests are negotiated by name and fail at once
            for e in list(cache.by_name.values()):
                if not self.quit.isdisjoint(self.members(e.key) or range(self.size)):
                    cache.erase(e.name)
        if joined_changed or quit_changed:
            for p in table.values():
                touched.setdefault(p.name, p)
        for p in sorted(touched.values(), key=lambda x: x.seq):
            self._check_complete(p, ready, errors)
        return quit_changed

    def _fail(self, p: Pending, msg: str, errors: dict[str, str]) -> None:
        del self.table[p.name]
        if self.rank in p.keys:
            errors[p.name] = msg

    def _check_complete(self, p: Pending, ready: list[Response], errors: dict[str, str]) -> None:
        keys = p.keys
        first = next(iter(keys.values()))
        if any(k != first for k in keys.values()):
            # wait until every rank that should take part has spoken, so the error names
            # them all and reaches every one of them in the same round
            members: set[int] = set()
            for k in keys.values():
                members.update(self.members(k) or range(self.size))
            present = set(keys) | self.quit  # (a rank that shut down never speaks again)
            if all(k.kind == ALLREDUCE for k in keys.values()):
                present |= set(self.joined)
            if members <= present:
                self._fail(p, mismatch_message(p.name, keys), errors)
            return
        kind = first.kind
        ps = self.process_sets.get(first.process_set)
        if self.quit or self.joined:
            msg = self._cannot_complete(p.name, kind, ps, keys)
            if msg is not None:
                self._fail(p, msg, errors)
                return
        if ps is not None and kind != JOIN and len(keys) == len(ps.ranks) and not self.joined:
            # every member has submitted the same thing (non-members cannot submit)
            del self.table[p.name]
            ready.append(Response(p.name, first, p.locals, seq=p.seq))
            return
        if ps is None:
            self._fail(p, f"{kind} '{p.name}' names process set {first.process_set}, which is not registered "
                          f"(ranks {sorted(keys)})", errors)
            return
        members_l = self.members(first)
        present = set(keys)
        if kind == ALLREDUCE:
            present |= set(self.joined)
        if kind == JOIN:
            present = set(self.joined)
        if not all(m in present for m in members_l):
            return
        del self.table[p.name]
        locals_ = {r: p.locals.get(r) for r in members_l}
        extra = None
        if kind == JOIN:
            extra = max(self.joined, key=lambda r: (self.joined[r], r))
            self.joined.clear()
            self.my_join_round = None
        ready.append(Response(p.name, first, locals_, seq=p.seq, extra_result=extra))

    def _cannot_complete(self, name: str, kind: str, ps: ProcessSetInfo | None,
                         keys: dict[int, OpKey]) -> str | None:
        """Why the pending op ``name`` can never complete, or None: a member that has not
        submitted it has shut down, or has joined and the op is not an allreduce (only
        allreduces go on with joined ranks, which contribute zeros)."""
        members = ps.ranks if ps is not None else list(range(self.size))
        if kind == JOIN:
            absent = [m for m in members if m not in self.joined]
        else:
            absent = [m for m in members if m not in keys and not (kind == ALLREDUCE and m in self.joined)]
        gone = [m for m in absent if m in self.quit]
        if gone:
            return (f"{kind} '{name}' cannot complete: rank(s) {gone} shut down without submitting it "
                    f"(submitted by ranks {sorted(keys)})")
        joined = [m for m in absent if m in self.joined and kind not in (JOIN, ALLREDUCE)]
        if joined:
            return (f"{kind} '{name}' cannot run while rank(s) {joined} have joined (hora.join): only allreduce "
                    "goes on with joined ranks; submit it on every rank before they join")
        return None

    def missing_ranks(self, p: Pending) -> list[int]:
        """The members that have not submitted ``p`` (joined ranks stand in for allreduces)."""
        first = next(iter(p.keys.values()))
        members = self.members(first) or list(range(self.size))
        return [m for m in members if m not in p.keys and not (first.kind == ALLREDUCE and m in self.joined)]
