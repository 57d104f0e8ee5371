"""Fusion: grouping ready allreduces into one collective, and copying in and out.

:func:`plan` is the one grouping (a normal round, a cached plan and a prediction all
use it): responses of one fusion key (dtype, op, process set, scales, compression,
device) go into one :class:`FusedGroup` until the fusion threshold would be passed.
:func:`pack` and :func:`unpack` are the one copy-in and copy-out. An out-of-place
request (``output`` None) gets its result made here, in one batched call for a whole
group (``torch._foreach_mul``/``_foreach_clone`` of the group's parts), not one
allocation per tensor on the caller's thread; a large lone result comes from the
:class:`OutputPool`, whose buffers are mapped once (with transparent huge pages where
the kernel allows) and come back when the caller drops the result, so a steady
``allreduce(t)`` of a big tensor does not pay the page faults of a fresh buffer every
call.
"""

from __future__ import annotations

import collections
import logging
import mmap
import threading
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from hora.native.engine.cache import Response
from hora.native.engine.negotiation import ProcessSetInfo
from hora.native.engine.request import ALLREDUCE, Request


def _clone_each(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


#: ``torch._foreach_clone`` (one call for a group of tensors) where this torch has it; torch
#: 2.11 (a CUDA image's) has not, and clones one by one
foreach_clone = getattr(torch, "_foreach_clone", None) or _clone_each

log = logging.getLogger(__name__)

POOL_MIN_BYTES = 1 << 20  # results at least this big come from the OutputPool
POOL_MAX_BYTES = 512 << 20  # bytes of returned buffers the pool keeps at most
_HUGE = 2 << 20  # pool buffers are whole multiples of a huge page


class FusedGroup:
    """Allreduce responses executed as one collective (and, once planned, their layout)."""

    __slots__ = ("ps", "resps", "reqs", "nbytes", "names", "sizes", "flat", "shapes", "views")

    def __init__(self, ps: ProcessSetInfo) -> None:
        self.ps = ps
        self.resps: list[Response] = []
        self.reqs: list[Request | None] = []
        self.nbytes = 0
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.shapes: list[tuple] = []
        self.flat = False
        self.views: tuple | None = None


class Single:
    """An unfused response (any kind but a fused allreduce) with the set it runs on."""

    __slots__ = ("resp", "ps")

    def __init__(self, resp: Response, ps: ProcessSetInfo) -> None:
        self.resp = resp
        self.ps = ps


Unit = FusedGroup | Single


def plan(responses: Sequence[Response], process_sets: dict[int, ProcessSetInfo], threshold: int) -> list[Unit]:
    """Group ``responses`` (in order) into execution units: allreduces into fused groups
    (a new group when adding one would pass ``threshold`` bytes), everything else alone.
    Responses of a process set this rank is not a member of are left out."""
    units: list[Unit] = []
    open_groups: dict[tuple, FusedGroup] = {}
    for resp in responses:
        ps = process_sets.get(resp.ps_id)
        if ps is None or not ps.group.is_member:
            continue  # not a member of this process set: nothing to do here
        if resp.kind != ALLREDUCE:
            units.append(Single(resp, ps))
            continue
        g = open_groups.get(resp.fkey)
        if g is None or (g.nbytes + resp.nbytes > threshold and g.nbytes > 0):
            g = open_groups[resp.fkey] = FusedGroup(ps)
            units.append(g)
        g.resps.append(resp)
        g.nbytes += resp.nbytes
    for u in units:
        if type(u) is FusedGroup:
            u.names = [r.name for r in u.resps]
            u.sizes = [r.numel for r in u.resps]
            u.shapes = [tuple(r.key.shape) for r in u.resps]
            u.flat = all(r.key.ndim == 1 for r in u.resps)
    return units


def flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 1 else t.view(-1)


def pack(parts: Sequence[torch.Tensor], reqs: Sequence[Request | None],
         shaped: Sequence[torch.Tensor] | None = None) -> None:
    """Copy each request's tensor into its part of a fusion buffer (zeros where a joined
    rank has no request). ``shaped``: the parts viewed with the tensors' shapes (then
    nothing is flattened per tensor)."""
    if None not in reqs:
        if shaped is not None:
            torch._foreach_copy_(list(shaped), [q.tensor for q in reqs])
        else:
            torch._foreach_copy_(list(parts), [flat(q.tensor) for q in reqs])
        return
    dsts, srcs = [], []
    for q, part in zip(reqs, parts):
        if q is None:
            part.zero_()
        else:
            dsts.append(part)
            srcs.append(flat(q.tensor))
    if dsts:
        torch._foreach_copy_(dsts, srcs)


def unpack(parts: Sequence[torch.Tensor], reqs: Sequence[Request | None], scale: float = 1.0,
           shaped: Sequence[torch.Tensor] | None = None) -> None:
    """Give each request its part of a reduced fusion buffer, times ``scale``: copied
    into its ``output``, or (out of place, ``output`` None) as a new tensor of the
    request's shape, made for the whole group in one batched call. ``shaped``: the
    parts viewed with the requests' shapes (made here when not given)."""
    # (never ``None in`` a list of tensors: that compares each tensor with None through torch)
    if shaped is not None and None not in reqs:
        made_here = [q.output is None for q in reqs].count(True)
        if made_here == 0 and (scale == 1.0 or len(reqs) > 64):  # every request in place
            outs = [q.output for q in reqs]
            torch._foreach_copy_(outs, list(shaped))
            if scale != 1.0:
                torch._foreach_mul_(outs, scale)
            return
        if made_here == len(reqs):  # every one out of place
            made = foreach_clone(list(shaped)) if scale == 1.0 else torch._foreach_mul(list(shaped), scale)
            for q, o in zip(reqs, made):
                q.output = o
            return
    into_d: list[torch.Tensor] = []
    into_s: list[torch.Tensor] = []
    new_i: list[int] = []
    for i, q in enumerate(reqs):
        if q is None:
            continue
        out = q.output
        if out is None:
            new_i.append(i)
        elif shaped is not None:
            into_d.append(out)
            into_s.append(shaped[i])
        else:
            into_d.append(flat(out))
            into_s.append(parts[i])
    if into_d:
        if scale == 1.0:
            torch._foreach_copy_(into_d, into_s)
        elif len(into_d) <= 64:  # scale while copying out: one pass over the data, not two
            mul = torch.mul
            for d, s in zip(into_d, into_s):
                mul(s, scale, out=d)
        else:
            torch._foreach_copy_(into_d, into_s)
            torch._foreach_mul_(into_d, scale)
    if new_i:
        if shaped is None:
            srcs = [parts[i].view(reqs[i].tensor.shape) for i in new_i]
        else:
            srcs = [shaped[i] for i in new_i]
        outs = foreach_clone(srcs) if scale == 1.0 else torch._foreach_mul(srcs, scale)
        for i, o in zip(new_i, outs):
            reqs[i].output = o


class FusionBuffers:
    """One reusable fusion buffer per (dtype, device), at least the fusion threshold big."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(self, dtype: torch.dtype, numel: int, device: torch.device, threshold: int) -> torch.Tensor:
        key = (dtype, device)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            cap = max(numel, threshold // torch.empty((), dtype=dtype).element_size())
            buf = torch.empty(cap, dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:numel]

    def base(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The whole buffer :meth:`get` cuts for ``dtype`` on ``device`` now (None: none
        yet); a new one replaces it when a larger request comes."""
        return self._bufs.get((dtype, device))

    def clear(self) -> None:
        self._bufs.clear()


def views(buf: torch.Tensor, group: FusedGroup) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The flat parts of ``buf`` for ``group``'s tensors and the same viewed with their
    shapes, kept on the group while the buffer stays the same (a planned group is reused
    round after round; a thousand views cost more than a copy)."""
    key = (buf.data_ptr(), buf.numel())
    got = group.views
    if got is None or got[0] != key:
        parts = list(buf.split(group.sizes))
        shaped = parts if group.flat else [p.view(s) for p, s in zip(parts, group.shapes)]
        got = group.views = (key, parts, shaped)
    return got[1], got[2]


class OutputPool:
    """Large result buffers that come back when the caller lets go of them.

    A result is a tensor over an anonymous mapping (advised for transparent huge pages);
    when the last reference to its memory goes, the mapping returns here and the next
    result of that size reuses it, already faulted in. Bounded by :data:`POOL_MAX_BYTES`
    (the oldest returned mappings are unmapped first).
    """

    def __init__(self, max_bytes: int = POOL_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: collections.OrderedDict[int, list[mmap.mmap]] = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.reused = 0
        self.mapped = 0

    def empty(self, shape: torch.Size | tuple, dtype: torch.dtype) -> torch.Tensor:
        """A new, uninitialized CPU tensor of ``shape`` and ``dtype``."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes < POOL_MIN_BYTES:
            return torch.empty(shape, dtype=dtype)
        size = -(-nbytes // _HUGE) * _HUGE
        with self._lock:
            lst = self._free.get(size)
            m = lst.pop() if lst else None
            if m is not None:
                self._held -= size
                self.reused += 1
                if not lst:
                    del self._free[size]
        if m is None:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    m.madvise(mmap.MADV_HUGEPAGE)
                except OSError:  # the kernel does not allow it: normal pages
                    pass
            self.mapped += 1
        arr = np.frombuffer(m, dtype=np.uint8, count=nbytes)
        weakref.finalize(arr, self._give_back, m, size).atexit = False
        return torch.from_numpy(arr).view(dtype).view(shape)

    def _give_back(self, m: mmap.mmap, size: int) -> None:
        with self._lock:
            self._free.setdefault(size, []).append(m)
            self._free.move_to_end(size)
            self._held += size
            while self._held > self.max_bytes and self._free:
                old_size, lst = next(iter(self._free.items()))
                lst.pop(0).close()
                self._held -= old_size
                if not lst:
                    del self._free[old_size]

    def clear(self) -> None:
        with self._lock:
            for lst in self._free.values():
                for m in lst:
                    m.close()
            self._free.clear()
            self._held = 0


#: the process's pool (results outlive engines: a later init reuses what came back)
OUTPUTS = OutputPool()

