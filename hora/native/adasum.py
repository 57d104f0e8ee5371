"""Adasum: the adaptive summation of gradients (Maleki et al., MLSys 2021; Horovod's ``hvd.Adasum``).

Two gradients ``a`` and ``b`` are combined as::

    Adasum(a, b) = (1 - a.b / (2 |a|^2)) a  +  (1 - a.b / (2 |b|^2)) b

(a coefficient whose norm is ~0 stays 1): orthogonal gradients add up, parallel ones
average. Over ``n`` ranks the pairs form a binary tree: rank 0 with 1, 2 with 3, then
{0, 1} with {2, 3}, and so on. Every tensor of a fused buffer (``segments``) gets its own
coefficients, so fusing changes nothing.

The tree runs as Horovod's VHDD (vector halving, distance doubling) for ``p``, a power of
two: at level ``d`` (1, 2, 4, ...) each rank swaps half of the slice it holds with rank
``g ^ d`` and combines the half it keeps, with dot products and norms summed over the
``2d`` ranks that hold the two vectors between them; after ``log2 p`` levels each rank
holds ``1/p`` of the result, and the same swaps in reverse give everyone all of it. Each
rank moves about ``2 x`` the buffer, as a ring allreduce does.

When ``n`` is not a power of two (Horovod refuses those sizes), ranks ``p .. n-1`` (``p``
the largest power of two below ``n``) first send their tensor to rank ``r - p``, which
combines the two with Adasum; VHDD runs among ranks ``0 .. p-1``; rank ``r - p`` then
sends the result back to rank ``r``. That is Adasum over the tree with the extra ranks as
leaves beside ranks ``0 .. n-p-1``. It is logged once per process.

Everything is built from the backend's ``alltoall`` (a pairwise swap: every row count but
the partner's is 0) and ``allreduce`` (the dot products of every subgroup of a level in
one small float64 vector), so Adasum works on every backend and process set.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from hora.native.backends.base import Backend, Group, ReduceOp

log = logging.getLogger(__name__)

_TINY = math.sqrt(2.2250738585072014e-308)  # sqrt(DBL_MIN), Horovod's threshold for a zero norm
_warned_sizes: set[int] = set()


def largest_power_of_two(n: int) -> int:
    """The largest power of two that is <= ``n`` (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def coefficients(dot: float, a_sq: float, b_sq: float) -> tuple[float, float]:
    """Adasum's weights of ``a`` and ``b`` from ``a.b``, ``|a|^2`` and ``|b|^2``."""
    ca = 1.0 - dot / a_sq * 0.5 if a_sq >= _TINY else 1.0
    cb = 1.0 - dot / b_sq * 0.5 if b_sq >= _TINY else 1.0
    return ca, cb


def _combine(mine: torch.Tensor, theirs: torch.Tensor, c_mine: float, c_theirs: float) -> None:
    """``mine = c_mine * mine + c_theirs * theirs``, computed in float64."""
    mine.copy_(mine.double().mul_(c_mine).add_(theirs.double(), alpha=c_theirs))


def _bounds(segments: Sequence[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in segments:
        out.append((start, start + n))
        start += n
    return out


def _local_dots(x: torch.Tensor, y: torch.Tensor, lo: int, bounds: list[tuple[int, int]],
                mine_is_a: bool) -> torch.Tensor:
    """[dot, |a|^2, |b|^2] per segment over the slice [lo, lo + len(x)) (x mine, y theirs)."""
    hi = lo + x.numel()
    out = torch.zeros(len(bounds), 3, dtype=torch.float64)
    for i, (s, e) in enumerate(bounds):
        a, b = max(s, lo), min(e, hi)
        if a >= b:
            continue
        xm = x[a - lo : b - lo].double()
        yt = y[a - lo : b - lo].double()
        mm, tt = torch.dot(xm, xm), torch.dot(yt, yt)
        out[i, 0] = torch.dot(xm, yt)
        out[i, 1], out[i, 2] = (mm, tt) if mine_is_a else (tt, mm)
    return out


def _apply(x: torch.Tensor, y: torch.Tensor, lo: int, bounds: list[tuple[int, int]], dots: torch.Tensor,
           mine_is_a: bool) -> None:
    hi = lo + x.numel()
    for i, (s, e) in enumerate(bounds):
        a, b = max(s, lo), min(e, hi)
        if a >= b:
            continue
        ca, cb = coefficients(*dots[i].tolist())
        c_mine, c_theirs = (ca, cb) if mine_is_a else (cb, ca)
        _combine(x[a - lo : b - lo], y[a - lo : b - lo], c_mine, c_theirs)


def _swap(be: Backend, group: Group, send: torch.Tensor, recv: torch.Tensor, partner: int | None) -> None:
    """Send ``send`` to group rank ``partner`` and receive ``recv`` from it (an alltoall in
    which every other count is 0); ``partner=None``: take part without moving anything."""
    n = group.size
    out_splits, in_splits = [0] * n, [0] * n
    if partner is not None:
        out_splits[partner] = recv.numel()
        in_splits[partner] = send.numel()
    be.alltoall(recv, send, out_splits, in_splits, group)


def allreduce(buf: torch.Tensor, segments: Sequence[int], be: Backend, group: Group) -> None:
    """Adasum of ``buf`` (1-D, contiguous, floating point) over ``group``, in place.

    ``segments``: the element counts of the tensors packed in ``buf`` (they sum to its
    length); each is combined with its own coefficients. Every member calls this alike.

    Raises:
        CollectiveError: from the backend.
    """
    n, g = group.size, group.rank
    if n == 1:
        return
    total = buf.numel()
    bounds = _bounds(segments)
    p = largest_power_of_two(n)
    empty = buf[:0]
    if p != n and n not in _warned_sizes:
        _warned_sizes.add(n)
        log.info("Adasum over %d ranks (not a power of two): ranks %d..%d are first combined with ranks 0..%d, "
                 "then VHDD runs among ranks 0..%d", n, p, n - 1, n - p - 1, p - 1)
    # fold the ranks beyond the largest power of two into their partners r - p
    if p != n:
        if g >= p:
            _swap(be, group, buf, empty, g - p)
        elif g < n - p:
            theirs = torch.empty_like(buf)
            _swap(be, group, empty, theirs, g + p)
            dots = _local_dots(buf, theirs, 0, bounds, True)
            _apply(buf, theirs, 0, bounds, dots, True)
        else:
            _swap(be, group, empty, empty, None)
    active = g < p
    lo, hi = 0, total
    ranges: list[tuple[int, int]] = []
    scratch = torch.empty_like(buf)
    d = 1
    while d < p:  # halve the vector, double the distance
        blocks = p // (2 * d)
        part = torch.zeros(blocks, len(bounds), 3, dtype=torch.float64)
        if active:
            partner = g ^ d
            mid = lo + (hi - lo) // 2
            left = (g & d) == 0
            keep, give = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
            theirs = scratch[: keep[1] - keep[0]]
            _swap(be, group, buf[give[0] : give[1]], theirs, partner)
            mine = buf[keep[0] : keep[1]]
            part[g // (2 * d)] = _local_dots(mine, theirs, keep[0], bounds, left)
        else:
            _swap(be, group, empty, empty, None)
        be.allreduce(part.view(-1), ReduceOp.Sum, group)
        if active:
            _apply(mine, theirs, keep[0], bounds, part[g // (2 * d)], left)
            ranges.append((lo, hi))
            lo, hi = keep
        d *= 2
    while d > 1:  # and back: every rank ends with every slice
        d //= 2
        if active:
            plo, phi = ranges.pop()
            other = (hi, phi) if lo == plo else (plo, lo)
            theirs = scratch[: other[1] - other[0]]
            _swap(be, group, buf[lo:hi], theirs, g ^ d)
            buf[other[0] : other[1]].copy_(theirs)
            lo, hi = plo, phi
        else:
            _swap(be, group, empty, empty, None)
    if p != n:  # unfold
        if g >= p:
            _swap(be, group, empty, buf, g - p)
        elif g < n - p:
            _swap(be, group, buf, empty, g + p)
        else:
            _swap(be, group, empty, empty, None)


def reference(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of one tensor per rank, computed locally in float64 along the same tree
    (for tests and for checking a backend)."""
    vs = [t.double().reshape(-1).clone() for t in tensors]
    n = len(vs)
    p = largest_power_of_two(n)

    def pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ca, cb = coefficients(float(a @ b), float(a @ a), float(b @ b))
        return ca * a + cb * b

    for r in range(p, n):
        vs[r - p] = pair(vs[r - p], vs[r])
    vs = vs[:p]
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0].reshape(tensors[0].shape)


__all__ = ["allreduce", "reference", "coefficients", "largest_power_of_two"]
