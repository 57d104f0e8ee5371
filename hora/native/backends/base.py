"""The interface every collective backend implements.

A backend is deliberately small: it moves *contiguous torch tensors* between the ranks
of a group, in place, and nothing else. Average, prescale/postscale, objects, varying
first dimensions, fusion, compression, process-set bookkeeping and name matching all
live above it, in :mod:`hora.native.engine`. (One exception, for speed: :meth:`Backend.allreduce_into`
reduces into another tensor and scales, which the shared-memory path does in its own passes.)

Every method is called from the engine's background thread only (one thread per
process talks to the backend), which keeps MPI's and Gloo's threading rules simple.
"""

from __future__ import annotations

import abc
import datetime
import enum
import logging
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)


class ReduceOp(enum.IntEnum):
    """Reduction operations of :func:`hora.native.allreduce` and friends."""

    Average = 0
    Sum = 1
    Min = 2
    Max = 3
    Product = 4
    Adasum = 5  # floating point only; the engine builds it from alltoall and allreduce (hora.native.adasum)

    def __repr__(self) -> str:  # hn.Sum reads better than <ReduceOp.Sum: 1>
        return f"hora.{self.name}"


class Group:
    """A set of global ranks the backend can run collectives over.

    ``ranks`` are global ranks in group order; ``rank`` is this process's index in the
    group (``None`` when this process is not a member); ``handle`` is the backend's own
    object (a ProcessGroup, an MPI communicator).
    """

    def __init__(self, ranks: Sequence[int], my_global_rank: int, handle: Any = None) -> None:
        self.ranks = list(ranks)
        self.rank = self.ranks.index(my_global_rank) if my_global_rank in self.ranks else None
        self.size = len(self.ranks)
        self.handle = handle
        self.shm: Any = None  # a ShmReducer when every member shares this host (Gloo)

    @property
    def is_member(self) -> bool:
        return self.rank is not None

    def __repr__(self) -> str:
        return f"Group(ranks={self.ranks}, rank={self.rank})"


class Waker(abc.ABC):
    """A job-wide wake-up signal per epoch, used by idle engine threads.

    ``signal(e)`` wakes every rank waiting on epoch ``e`` (idempotent, any rank may call
    it); ``wait(e, timeout)`` returns True once this rank was woken for epoch ``e``;
    ``wake_self(e)`` wakes only this rank (used by shutdown).
    """

    @abc.abstractmethod
    def signal(self, epoch: int) -> None: ...

    @abc.abstractmethod
    def wake_self(self, epoch: int) -> None: ...

    @abc.abstractmethod
    def wait(self, epoch: int, timeout: float) -> bool: ...

    def forget(self, epoch: int) -> None:  # noqa: B027 - optional clean-up
        """Drop this rank's state of an epoch it has left (called by its engine thread,
        never while it waits)."""

    def close(self) -> None:  # noqa: B027
        """Release connections (optional)."""


class StoreWaker(Waker):
    """A :class:`Waker` over a torch.distributed Store (TCPStore or HashStore).

    One key per rank and epoch. Two clients: one that blocks in ``wait`` on the engine
    thread, one that callers use to ``signal``, so a signal never queues behind a
    blocked wait on the same socket.
    """

    def __init__(self, signal_store: Any, wait_store: Any, rank: int, size: int, prefix: str = "hora/wake/") -> None:
        self._sig = signal_store
        self._wait = wait_store
        self._rank = rank
        self._size = size
        self._prefix = prefix

    def _key(self, epoch: int, rank: int) -> str:
        return f"{self._prefix}{epoch}/{rank}"

    def signal(self, epoch: int) -> None:
        keys = [self._key(epoch, r) for r in range(self._size)]
        self._sig.multi_set(keys, [b"1"] * len(keys))

    def wake_self(self, epoch: int) -> None:
        self._sig.set(self._key(epoch, self._rank), b"1")

    def wait(self, epoch: int, timeout: float) -> bool:
        try:
            self._wait.wait([self._key(epoch, self._rank)], datetime.timedelta(seconds=timeout))
            return True
        except Exception as exc:  # DistStoreError on timeout; anything else is real
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                return False
            raise

    def forget(self, epoch: int) -> None:
        # on the waiting client, which only the engine thread uses: a caller's signal on
        # the other client never queues behind it
        try:
            self._wait.delete_key(self._key(epoch, self._rank))
        except Exception:  # a store without delete_key: keys are tiny, keep them
            pass


class Backend(abc.ABC):
    """Collectives on contiguous torch tensors, in place, over a :class:`Group`.

    Subclasses set ``name`` and implement the abstract methods. ``rank``/``size`` are the
    global rank and size; ``world`` is the group of all ranks.
    """

    name: str = "?"

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.world: Group = Group(range(size), rank)

    # -- capabilities -------------------------------------------------------------------
    def supports_reduce(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        """Whether :meth:`allreduce` can reduce ``dtype`` with ``op`` natively (else the
        engine upcasts to float32/float64 around the call)."""
        return True

    # -- groups ---------------------------------------------------------------------------
    @abc.abstractmethod
    def new_group(self, ranks: Sequence[int], group_id: int) -> Group:
        """Create the group of global ``ranks`` (called on every rank; members connect)."""

    def destroy_group(self, group: Group) -> None:  # noqa: B027
        """Release a group made by :meth:`new_group`."""

    def interrupt(self, groups: Sequence[Group]) -> None:  # noqa: B027
        """Unblock, best effort, a collective the engine thread is waiting in over one of
        ``groups`` (called from another thread when a shutdown gives up waiting; the
        groups are unusable afterwards). A call that cannot be interrupted returns at the
        collective timeout."""

    # -- collectives ----------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        """Reduce ``buf`` across the group in place (``op`` is Sum, Min, Max or Product)."""

    def allreduce_into(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group,
                       scale: float = 1.0) -> None:
        """Reduce ``inp`` across the group into ``out`` (same shape, floating point; ``inp``
        may be ``out``), then multiply by ``scale``; ``inp`` is left as it was. Every member
        of the group must call it alike (same ``op`` and ``scale``). The default copies and reduces
        in place; a backend that can read ``inp`` and write ``out`` directly overrides it
        (one pass over the data fewer)."""
        if inp is not out:
            out.copy_(inp)
        self.allreduce(out, op, group)
        if scale != 1.0:
            out.mul_(scale)

    @abc.abstractmethod
    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> None:
        """``out`` (group.size * inp.numel() elements) receives every member's ``inp`` in rank order."""

    @abc.abstractmethod
    def broadcast(self, buf: torch.Tensor, root: int, group: Group) -> None:
        """Copy ``buf`` of group rank ``root`` into ``buf`` of every member."""

    @abc.abstractmethod
    def alltoall(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group
    ) -> None:
        """Send ``in_splits[j]`` rows of ``inp`` to member j; receive ``out_splits[j]`` rows from j."""

    def reducescatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group) -> None:
        """``out`` receives this member's equal chunk of the reduction of ``inp``.

        The default reduces a copy of ``inp`` and slices it; backends with a native
        reduce-scatter override it.
        """
        tmp = inp.clone()
        self.allreduce(tmp, op, group)
        n = out.numel()
        out.view(-1).copy_(tmp.view(-1)[group.rank * n : (group.rank + 1) * n])

    @abc.abstractmethod
    def barrier(self, group: Group) -> None:
        """Return once every member has entered."""

    # -- life cycle -----------------------------------------------------------------------
    @abc.abstractmethod
    def make_waker(self) -> Waker:
        """The job-wide wake-up signal the engine's idle thread blocks on."""

    def torch_store(self) -> Any:
        """The job's ``torch.distributed`` Store of this init (what a ``torch.distributed`` process
        group of the same ranks can be built over), or None when the transport has none."""
        return getattr(self, "_store", None)

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release every resource (idempotent)."""
