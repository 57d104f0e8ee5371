"""Allreduce through shared memory for the ranks of a group that share one host.

Gloo moves every byte through TCP, also between two processes on the same machine: on
loopback that is two kernel copies per byte and direction. A 4 MiB allreduce of two ranks
costs about 4 ms of CPU per rank that way, and on a CPU-bound training job that time is
taken from the computation. Here each member maps a segment of every other member
(files in ``/dev/shm``, unlinked once everyone has mapped them), and a reduction is

1. copy the buffer into my segment; tell every peer (one byte on a Unix socket) and wait
   until every peer has told me;
2. reduce my 1/L chunk of the buffer in my own segment, reading the same chunk of every
   peer's segment; tell and wait again;
3. copy each chunk of the result from the segment of the member that reduced it.

Each chunk is reduced by exactly one member, so every member receives the same bits. A
buffer of at most :data:`ONE_STEP_MAX_BYTES` (over the number of peers) is reduced in one
step instead: after step 1 every member reduces the whole buffer from every segment, in
group order (the same operations on the same bytes, so the same bits on every member);
for a small buffer the second exchange, not the bytes, is the cost.

A segment has two halves used in turn: a peer may still read the half of the previous
piece while I fill the other one, and by the time I fill this half again, every peer has
told me it finished the piece that read it (step 1 of the next piece comes after its
step 3). Buffers larger than a half go through in pieces.

The sockets (Unix sockets beside the segments, unlinked with them) carry one byte per
step and have the collective timeout: a member that never arrives is named in a
:class:`CollectiveError`, and one whose process has died is noticed at once (the kernel
closes its end).

When the members of a group sit on several hosts (by their advertised address,
``HORA_HOSTNAME``) and some share one, the allreduce is hierarchical
(:class:`HierarchicalReducer`): through shared memory on each host, through Gloo among
one member per host, and back through shared memory on each host. When no two members
share a host, the group uses Gloo alone.

Whether a group can use this is decided when the group is built, by every member at
once: each creates its segment and its socket, then tries to map the segment and reach
the socket of every peer; the members agree (an allreduce of a flag over Gloo) and use
shared memory only if all of them succeeded. Ranks on other hosts, other containers or
a full ``/dev/shm`` simply fall back to Gloo.

``HORA_SHM_ALLREDUCE=0`` turns this off; ``HORA_SHM_BUFFER_MB`` is the size of a half
(default 8 MiB, so 16 MiB of ``/dev/shm`` per rank and group).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import mmap
import os
import re
import secrets
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import torch

from hora.errors import CollectiveError, ConfigError
from hora.native.backends.base import Group, ReduceOp
from hora import settings
from hora.native.rendezvous import recv_exact

log = logging.getLogger(__name__)

ENV_SHM = settings.ENV_SHM_ALLREDUCE
ENV_SHM_BUFFER_MB = "HORA_SHM_BUFFER_MB"
ENV_SHM_SPIN_US = "HORA_SHM_SPIN_US"
DEFAULT_BUFFER_MB = settings.default(ENV_SHM_BUFFER_MB)
SHM_DIR = "/dev/shm"
_ALIGN = 64  # bytes: chunk boundaries on cache lines
# a buffer up to this size (over the number of peers) is reduced in one step (one exchange;
# every member reduces all of it): the second exchange, not the bytes, is what a small
# reduction costs
ONE_STEP_MAX_BYTES = 256 << 10

# dtypes the reduction loops below handle (torch's own CPU kernels); others go to Gloo
DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_REDUCE = {
    ReduceOp.Sum: torch.add,
    ReduceOp.Min: torch.minimum,
    ReduceOp.Max: torch.maximum,
    ReduceOp.Product: torch.mul,
}
_STEP_FILLED, _STEP_REDUCED = b"F", b"R"
_HELLO = struct.Struct("!32sI")  # token, group rank of the connecting member


def enabled() -> bool:
    """Whether ``HORA_SHM_ALLREDUCE`` allows shared memory (default yes).

    Raises:
        ConfigError: the variable is set to something other than 0/1/true/false/yes/no.
    """
    return settings.get(ENV_SHM)


def buffer_bytes() -> int:
    """The size of one half of a segment, from ``HORA_SHM_BUFFER_MB`` (default 8).

    Raises:
        ConfigError: not a positive number.
    """
    mb = settings.get(ENV_SHM_BUFFER_MB)
    return max(_ALIGN, int(mb * (1 << 20)) // _ALIGN * _ALIGN)


def availability() -> tuple[bool, str]:
    """Whether this host can give ranks a shared-memory allreduce, and why (``hora check``)."""
    try:
        if not enabled():
            return False, f"off ({ENV_SHM}=0)"
        need = 2 * buffer_bytes()
    except ConfigError as exc:
        return False, str(exc)
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        return False, f"{SHM_DIR} is missing or not writable: ranks on one host use Gloo"
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    return free >= need, (f"{SHM_DIR}, {free / (1 << 30):.1f} GiB free, {need >> 20} MiB per rank and group "
                          "(allreduce between ranks on one host)")


class ShmReducer:
    """The shared-memory allreduce of one group (see the module docstring).

    Build it with :func:`connect`, which returns no reducer when the group cannot use
    shared memory. Used by one thread at a time (the engine's), like the backend.
    """

    def __init__(self, group: Group, half: int, timeout: float) -> None:
        self.group = group
        self.half = half
        self.timeout = timeout
        self.pieces = 0  # pieces reduced so far: selects the half, the same on every member
        self._maps: dict[int, mmap.mmap] = {}  # group rank -> segment (mine included)
        self._bytes: dict[int, torch.Tensor] = {}  # group rank -> uint8 view of it
        self._socks: dict[int, socket.socket] = {}  # peer group rank -> connection
        # polls of those connections: a step polls them for ``spin`` seconds before it
        # sleeps in recv (waking a sleeping process costs some 50 us on a VM; the
        # peer is often a few microseconds away)
        self._polls: dict[int, Any] = {}
        self.spin = settings.get(ENV_SHM_SPIN_US) * 1e-6
        self._files: list[str] = []  # my segment's path until it is unlinked
        self.paths: list[str] = []  # every member's segment path (unlinked after set-up)
        self._listener: socket.socket | None = None
        self._broken: CollectiveError | None = None  # after a failure the steps are out of sync
        self._views: dict[tuple, list[torch.Tensor]] = {}  # (base, numel, dtype) -> every member's segment
        # (each member reads every peer's bytes: with more members, only smaller buffers pay)
        self._one_step_max = min(half, ONE_STEP_MAX_BYTES // max(1, group.size - 1))

    # -- set-up ---------------------------------------------------------------------------
    def _setup(self, store: Any) -> bool:
        """Segments, then mappings, then sockets; after each stage the members vote
        through the store, so one that failed never leaves the others waiting."""
        g, size = self.group.rank, self.group.size
        td = datetime.timedelta(seconds=self.timeout)
        if g == 0:
            store.set("token", secrets.token_hex(16))
        store.wait(["token"], td)
        token = store.get("token").decode()
        # the creator's pid is in the name, so a segment left by a killed process can be
        # told from a live one and swept (see _sweep_stale)
        def path_of(p: int, pid: int) -> str:
            return os.path.join(SHM_DIR, f"hora-{token}-{p}-{pid}")

        mine = path_of(g, os.getpid())
        self._files += [mine, mine + ".sock"]
        ok = True
        try:
            _sweep_stale(self.timeout + 60.0)
            fd = os.open(mine, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, 2 * self.half)  # ENOSPC now, never SIGBUS later
                self._maps[g] = mmap.mmap(fd, 2 * self.half)
            finally:
                os.close(fd)
            # a socket beside the segment: whoever can open one can reach the other
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(mine + ".sock")
            os.chmod(mine + ".sock", 0o600)
            self._listener.listen(size)
        except Exception as exc:  # OSError; AttributeError where os lacks posix_fallocate
            log.info("rank %d: cannot create a shared-memory segment in %s: %s", self.group.ranks[g], SHM_DIR, exc)
            ok = False
        pids = self._vote(store, "made", ok, td, str(os.getpid()))
        if pids is None:
            return False
        self.paths = [path_of(p, int(pid)) for p, pid in enumerate(pids)]
        socks = [path + ".sock" for path in self.paths]
        try:
            for p in range(size):
                if p != g:
                    fd = os.open(self.paths[p], os.O_RDWR)
                    try:
                        if os.fstat(fd).st_size < 2 * self.half:
                            raise OSError(f"the segment of rank {self.group.ranks[p]} is too short")
                        self._maps[p] = mmap.mmap(fd, 2 * self.half)
                    finally:
                        os.close(fd)
        except Exception as exc:  # another host, another /dev/shm
            log.info("rank %d: cannot map the segments of ranks %s: %s", self.group.ranks[g], self.group.ranks, exc)
            ok = False
        if self._vote(store, "mapped", ok, td) is None:
            return False
        # every member can reach every socket: connect to those before me, accept the rest
        for p in range(g):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            s.connect(socks[p])
            s.sendall(_HELLO.pack(token.encode(), g))
            self._socks[p] = s
        self._listener.settimeout(self.timeout)
        while len(self._socks) < size - 1:
            s, _ = self._listener.accept()
            s.settimeout(self.timeout)
            tok, p = _HELLO.unpack(recv_exact(s, _HELLO.size))
            if tok != token.encode() or not g < p < size or p in self._socks:
                s.close()
                raise OSError(f"unexpected connection on the shared-memory socket (group rank {p})")
            self._socks[p] = s
        self._listener.close()
        self._listener = None
        for p, s in self._socks.items():
            poll = select.poll()
            poll.register(s, select.POLLIN)
            self._polls[p] = poll
        for p, m in self._maps.items():
            self._bytes[p] = torch.frombuffer(m, dtype=torch.uint8)
        return True

    def _vote(self, store: Any, stage: str, ok: bool, td: datetime.timedelta, note: str = "") -> list[str] | None:
        """Publish whether this member got through ``stage`` (with ``note``); every
        member's note in group order when every member did, else None."""
        store.set(f"{stage}/{self.group.rank}", ("1" + note) if ok else "0")
        keys = [f"{stage}/{p}" for p in range(self.group.size)]
        store.wait(keys, td)
        votes = [v.decode() for v in store.multi_get(keys)]
        return [v[1:] for v in votes] if all(v.startswith("1") for v in votes) else None

    def _unlink(self) -> None:
        for path in self._files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._files.clear()

    def interrupt(self) -> None:
        """Wake a thread blocked in a step of this reducer (from another thread): its
        sockets are shut down, so the step fails at once; the reducer is broken after."""
        for s in list(self._socks.values()):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Release the segments and sockets (idempotent). Call it only once no thread can
        be inside :meth:`allreduce` or :meth:`broadcast`: the segments are unmapped."""
        self._unlink()
        for s in self._socks.values():
            with contextlib.suppress(OSError):
                s.close()
        self._socks.clear()
        self._polls.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._views.clear()  # the views hold the maps' buffers: drop them first
        self._bytes.clear()
        for m in self._maps.values():
            with contextlib.suppress(BufferError):  # a view still alive somewhere: GC frees it
                m.close()
        self._maps.clear()

    # -- the collective -------------------------------------------------------------------
    @staticmethod
    def supports(buf: torch.Tensor, op: ReduceOp) -> bool:
        return buf.is_cpu and buf.dtype in DTYPES and op in _REDUCE

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, src: torch.Tensor | None = None,
                  scale: float = 1.0) -> None:
        """Reduce ``buf`` (contiguous, CPU, a dtype of :data:`DTYPES`) in place, or reduce
        ``src`` (same size and dtype) into ``buf``; then multiply by ``scale`` (floating
        point only). Each member scales the chunk it reduced, in its segment, so every
        member still receives the same bits. A buffer of at most
        :data:`ONE_STEP_MAX_BYTES` over the number of peers is reduced in one step: after
        the one exchange every member reduces all of it from every segment, in group
        order (the same bits everywhere), which saves the second exchange, the round trip
        that dominates a small reduction.

        Raises:
            CollectiveError: a member did not arrive within the timeout or has gone.
        """
        flat = buf if buf.dim() == 1 else buf.view(-1)
        if 0 < flat.numel() * flat.element_size() <= self._one_step_max:
            self._allreduce_one_step(flat, _REDUCE[op], src, scale)
            return
        g, size = self.group.rank, self.group.size
        fn = _REDUCE[op]
        srcs = self._split(src.view(-1)) if src is not None else None
        for i, (x, base) in enumerate(self._pieces(buf)):
            seg = self._segments(base, x.numel(), x.dtype)
            seg[g].copy_(x if srcs is None else srcs[i])
            self._exchange(_STEP_FILLED)
            step = -(-x.numel() // size)
            step = -(-step * x.element_size() // _ALIGN) * _ALIGN // x.element_size()
            lo, hi = min(g * step, x.numel()), min((g + 1) * step, x.numel())
            if lo < hi:
                mine = seg[g][lo:hi]
                for p in range(size):
                    if p != g:
                        fn(mine, seg[p][lo:hi], out=mine)
                if scale != 1.0:
                    mine.mul_(scale)
            self._exchange(_STEP_REDUCED)
            for p in range(size):
                a, b = min(p * step, x.numel()), min((p + 1) * step, x.numel())
                if a < b:
                    x[a:b].copy_(seg[p][a:b])

    def _allreduce_one_step(self, flat: torch.Tensor, fn: Any, src: torch.Tensor | None, scale: float) -> None:
        """One piece, one exchange: fill my segment, then reduce every segment into ``flat``.

        (The halves still alternate: a member fills this half again two pieces later,
        after every peer told it that it filled the next piece, which each does only
        after it finished reading this one.)"""
        if self._broken is not None:
            raise CollectiveError(f"{self._broken} (an earlier shared-memory collective failed)")
        base = (self.pieces % 2) * self.half
        self.pieces += 1
        seg = self._segments(base, flat.numel(), flat.dtype)
        seg[self.group.rank].copy_(flat if src is None else src if src.dim() == 1 else src.view(-1))
        self._exchange(_STEP_FILLED)
        fn(seg[0], seg[1], out=flat)
        for p in range(2, len(seg)):
            fn(flat, seg[p], out=flat)
        if scale != 1.0:
            flat.mul_(scale)

    def _segments(self, base: int, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every member's segment (group order) at byte ``base``, as ``numel`` elements of
        ``dtype`` (kept: a training loop reduces the same sizes step after step)."""
        key = (base, numel, dtype)
        seg = self._views.get(key)
        if seg is None:
            if len(self._views) >= 64:
                self._views.clear()
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            seg = self._views[key] = [self._bytes[p][base:base + nbytes].view(dtype) for p in range(self.group.size)]
        return seg

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` cut as :meth:`_pieces` cuts a buffer of its size."""
        per_piece = self.half // flat.element_size()
        return [flat[lo:lo + per_piece] for lo in range(0, flat.numel(), per_piece)]

    def broadcast(self, buf: torch.Tensor) -> None:
        """Copy ``buf`` of group rank 0 into ``buf`` of every member, in place.

        Raises:
            CollectiveError: a member did not arrive within the timeout or has gone.
        """
        for x, base in self._pieces(buf):
            seg = self._bytes[0][base:base + x.numel() * x.element_size()].view(x.dtype)
            if self.group.rank == 0:
                seg.copy_(x)
            self._exchange(_STEP_FILLED)
            if self.group.rank != 0:
                x.copy_(seg)

    def _pieces(self, buf: torch.Tensor) -> Iterator[tuple[torch.Tensor, int]]:
        """``buf`` in pieces that fit a half, each with the byte offset of its half (the
        halves alternate, piece by piece, on every member alike)."""
        if self._broken is not None:
            raise CollectiveError(f"{self._broken} (an earlier shared-memory collective failed)")
        flat = buf.view(-1)
        per_piece = self.half // flat.element_size()
        for lo in range(0, flat.numel(), per_piece):
            base = (self.pieces % 2) * self.half
            self.pieces += 1
            yield flat[lo:lo + per_piece], base

    def _exchange(self, step: bytes) -> None:
        """Tell every peer this member has done ``step``; wait until each has told me."""
        for p, s in self._socks.items():
            try:
                s.sendall(step)
            except OSError as exc:  # EPIPE, ECONNRESET: its end is closed
                raise self._error(p, f"closed its connection (its process ended?): {exc}") from exc
        spin = self.spin
        end = time.perf_counter() + spin if spin else 0.0
        for p, s in self._socks.items():
            if spin:
                # the byte is often about to come: polling for it (a syscall that returns
                # at once) beats sleeping in recv and being woken by the kernel; a peer
                # that has gone away shows as readable too (its end closed), so recv tells
                poll, clock = self._polls[p].poll, time.perf_counter
                while not poll(0) and clock() < end:
                    pass
            try:
                got = s.recv(1)
            except TimeoutError:
                raise self._error(p, f"did not arrive within {self.timeout:g}s") from None
            except OSError as exc:
                raise self._error(p, f"is unreachable ({exc})") from exc
            if got != step:
                raise self._error(p, "closed its connection (its process ended?)" if not got
                                  else f"is out of step (sent {got!r}, expected {step!r})")

    def _error(self, peer: int, what: str) -> CollectiveError:
        self._broken = CollectiveError(
            f"shared-memory allreduce over ranks {self.group.ranks} (rank {self.group.ranks[self.group.rank]}, "
            f"piece {self.pieces}): rank {self.group.ranks[peer]} {what}")
        return self._broken


def connect(group: Group, store: Any, gloo_allreduce: Any, timeout: float,
            half: int | None = None) -> tuple[bool, ShmReducer | None]:
    """Set up shared memory among the members of ``group``, who share one host (every
    member calls this at the same point). Returns (ok, reducer): ok is the same on every
    member of the *agreement* (``gloo_allreduce(tensor)`` sums an int64 tensor over it;
    it may span more members than ``group``), reducer is None for a group of one.
    Exactly two agreements are made whatever happens, so members of different groups
    can agree together.

    Raises:
        ConfigError: ``HORA_SHM_ALLREDUCE`` or ``HORA_SHM_BUFFER_MB`` is malformed.
    """
    half = half if half is not None else buffer_bytes()
    if not _agree(gloo_allreduce, enabled()):  # one member turned it off: nobody tries
        _agree(gloo_allreduce, False)
        return False, None
    me = ShmReducer(group, half, timeout) if group.size > 1 else None
    ok = True
    if me is not None:
        try:
            ok = me._setup(store)
        except Exception as exc:  # any failure means: use Gloo (logged, not raised)
            log.info("rank %d: no shared-memory allreduce for ranks %s: %s", group.ranks[group.rank],
                     group.ranks, exc)
            ok = False
    try:
        ok = _agree(gloo_allreduce, ok)
    finally:
        # every member has mapped every segment (or given up) before the agreement:
        # the names are no longer needed, and nothing is left in /dev/shm on a crash
        if me is not None:
            me._unlink()
    if not ok:
        if me is not None:
            me.close()
        return False, None
    if me is not None:
        log.debug("rank %d: shared-memory allreduce for ranks %s, %d bytes per piece",
                  group.ranks[group.rank], group.ranks, me.half)
    return True, me


class HierarchicalReducer:
    """Allreduce of a group whose members sit on several hosts, some with several
    members: reduce on each host through shared memory, allreduce across hosts among one
    member per host (Gloo), then spread the result on each host through shared memory.
    Only one member per host sends over the network, with the bytes of one buffer.
    """

    def __init__(self, local: ShmReducer | None, cross_allreduce: Any, cross_supports: Any) -> None:
        self.local = local  # None: this member is alone on its host
        self.cross_allreduce = cross_allreduce  # None: not this host's leader
        self.cross_supports = cross_supports  # (dtype, op) -> whether the hosts' link can reduce it

    def supports(self, buf: torch.Tensor, op: ReduceOp) -> bool:
        return ShmReducer.supports(buf, op) and self.cross_supports(buf.dtype, op)

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, src: torch.Tensor | None = None,
                  scale: float = 1.0) -> None:
        if self.local is not None:
            self.local.allreduce(buf, op, src=src)
        elif src is not None:
            buf.copy_(src)
        if self.cross_allreduce is not None:
            self.cross_allreduce(buf, op)
        if self.local is not None:
            self.local.broadcast(buf)
        if scale != 1.0:
            buf.mul_(scale)

    def interrupt(self) -> None:
        if self.local is not None:
            self.local.interrupt()

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        self.cross_allreduce = None


_SEGMENT_NAME = re.compile(r"^hora-[0-9a-f]{32}-\d+-(\d+)(\.sock)?$")


def _sweep_stale(min_age: float) -> None:
    """Remove this user's segments and sockets whose creating process is gone, older than
    ``min_age`` seconds (a process killed during set-up, before it unlinked them)."""
    now = time.time()
    for entry in os.scandir(SHM_DIR):
        m = _SEGMENT_NAME.match(entry.name)
        if m is None:
            continue
        pid = int(m.group(1))
        try:
            st = entry.stat(follow_symlinks=False)
            if pid == os.getpid() or st.st_uid != os.getuid() or now - st.st_mtime < min_age:
                continue
            os.kill(pid, 0)  # alive (or another user's): keep
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                log.info("removed %s, left by process %d that no longer exists", entry.path, pid)
        except OSError:
            continue


def _agree(gloo_allreduce: Any, ok: bool) -> bool:
    """True on every member when ``ok`` is True on every member."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64)
    gloo_allreduce(flag)
    return int(flag.item()) == 0

