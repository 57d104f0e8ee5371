"""Gloo backend: torch.distributed's ProcessGroupGloo, used directly.

hora does not touch torch.distributed's default group: it builds its own
``ProcessGroupGloo`` objects over a ``TCPStore`` that rank 0 creates on a free port and
publishes through the job's authenticated rendezvous store. The Gloo device is bound to
the worker's advertised address (``HORA_HOSTNAME``), never to whatever the machine's
hostname resolves to.

Allreduce among ranks that share one host goes through shared memory instead of Gloo's
TCP loopback (:mod:`hora.native.backends.shm`; ``HORA_SHM_ALLREDUCE=0`` turns it off):
about 4x less CPU per byte (benchmarks/README.md), which a CPU-bound training job gets back as compute time.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from hora.errors import CollectiveError, DataError, RendezvousError
from hora.native.backends.base import Backend, Group, ReduceOp, StoreWaker, Waker
from hora.native.backends import shm

log = logging.getLogger(__name__)

_TORCH_OPS = {
    ReduceOp.Sum: dist.ReduceOp.SUM,
    ReduceOp.Min: dist.ReduceOp.MIN,
    ReduceOp.Max: dist.ReduceOp.MAX,
    ReduceOp.Product: dist.ReduceOp.PRODUCT,
}

# dtypes Gloo reduces (torch 2.13: int16, uint16/32/64 fail with "Invalid scalar type")
_GLOO_REDUCES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                           torch.float32, torch.float64, torch.bool})
# dtypes Gloo moves as they are (allgather, broadcast, alltoall); any other one travels as its bytes
_GLOO_MOVES = _GLOO_REDUCES


SHM_GATHER_MAX_BYTES = 64 << 10  # an allgather up to this size goes through shared memory


def _movable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a tensor Gloo moves: itself, or its bytes (uint8, one row per row of dim
    0, so alltoall's row counts keep their meaning) for a dtype Gloo lacks (int16,
    uint16/32/64, complex...): moved, never computed on."""
    if t.dtype in _GLOO_MOVES:
        return t
    rows = t.shape[0] if t.dim() else 1
    per_row = t.numel() // rows if rows else int(torch.Size(t.shape[1:]).numel())
    return t.reshape(rows, per_row).view(torch.uint8)


def torch_reduce_op(op: ReduceOp) -> Any:
    try:
        return _TORCH_OPS[op]
    except KeyError:
        raise CollectiveError(f"the backend cannot reduce with {op!r} directly") from None


def make_stores(rank: int, size: int, hostname: str, kv: Any, key: str, timeout: float) -> tuple[Any, Any]:
    """Create the job's TCPStore (rank 0 serves it on a free port, published under ``key``
    in the rendezvous store ``kv``) and return two clients of it: (main, waiter).

    Raises:
        RendezvousError: the address never appeared or the store cannot be reached.
    """
    td = datetime.timedelta(seconds=timeout)
    try:
        if rank == 0:
            main = dist.TCPStore(hostname, 0, None, True, td, wait_for_workers=False)
            kv.set(key, f"{hostname}:{main.port}".encode())
            host, port = hostname, main.port
        else:
            host, _, port_s = kv.get(key, timeout=timeout).decode().rpartition(":")
            port = int(port_s)
            main = dist.TCPStore(host, port, None, False, td)
        waiter = dist.TCPStore(host, port, None, False, td)
    except RendezvousError:
        raise
    except Exception as exc:
        raise RendezvousError(f"rank {rank}: cannot set up the collective store: {exc}") from exc
    return main, waiter


class GlooBackend(Backend):
    """Collectives on CPU tensors through ProcessGroupGloo (allreduce of host-local groups
    through shared memory)."""

    name = "gloo"

    def __init__(
        self,
        rank: int,
        size: int,
        *,
        store: Any,
        wait_store: Any,
        hostname: str = "127.0.0.1",
        timeout: float = 300.0,
    ) -> None:
        super().__init__(rank, size)
        self._store = store
        self._wait_store = wait_store
        self._hostname = hostname
        self._timeout = datetime.timedelta(seconds=timeout)
        self.world = self._make_group(range(size), "world")

    def _make_group(self, ranks: Sequence[int], tag: str) -> Group:
        group = Group(ranks, self.rank)
        if not group.is_member:
            return group
        prefix = dist.PrefixStore(f"hora/pg/{tag}/", self._store)
        try:
            group.handle = dist.ProcessGroupGloo(prefix, group.rank, group.size, self._gloo_options())
        except Exception as exc:
            raise CollectiveError(
                f"rank {self.rank}: cannot connect Gloo group {tag} of ranks {list(ranks)}: {exc}"
            ) from exc
        group.shm = self._shared_memory(group, tag)
        return group

    def _shared_memory(self, group: Group, tag: str) -> Any:
        """The shared-memory allreduce of ``group``: flat when every member is on this
        host, hierarchical when the members sit on several hosts and some share one, None
        when no two members share a host or any member cannot (every member alike).
        Members are placed by their advertised address (``HORA_HOSTNAME``)."""
        if group.size < 2:
            return None
        store = dist.PrefixStore(f"hora/shm/{tag}/", self._store)
        timeout = self._timeout.total_seconds()
        store.set(f"host/{group.rank}", self._hostname)
        keys = [f"host/{g}" for g in range(group.size)]
        store.wait(keys, self._timeout)
        hosts = [v.decode() for v in store.multi_get(keys)]
        if len(set(hosts)) == group.size:
            return None  # one member per host: nothing to share
        agree = partial(self._gloo_allreduce, op=ReduceOp.Sum, group=group)
        if len(set(hosts)) == 1:
            return shm.connect(group, store, agree, timeout)[1]
        order = list(dict.fromkeys(hosts))  # hosts in the order of their first member
        mine = hosts[group.rank]
        local = Group([r for r, h in zip(group.ranks, hosts) if h == mine], self.rank)
        ok, reducer = shm.connect(local, dist.PrefixStore(f"local/{order.index(mine)}/", store), agree, timeout)
        if not ok:
            return None
        leaders = Group([group.ranks[hosts.index(h)] for h in order], self.rank)
        cross = None
        if leaders.is_member:
            try:
                leaders.handle = dist.ProcessGroupGloo(dist.PrefixStore(f"hora/pg/{tag}/cross/", self._store),
                                                       leaders.rank, leaders.size, self._gloo_options())
            except Exception as exc:
                raise CollectiveError(f"rank {self.rank}: cannot connect the Gloo group of one rank per host "
                                      f"{leaders.ranks} (group {tag}): {exc}") from exc
            cross = partial(self._gloo_allreduce, group=leaders)
        log.debug("rank %d: hierarchical allreduce for ranks %s: on this host %s, across hosts %s",
                  self.rank, group.ranks, local.ranks, leaders.ranks)
        return shm.HierarchicalReducer(reducer, cross, self.supports_reduce)

    def _gloo_options(self) -> Any:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self._hostname)]
        opts._timeout = self._timeout
        return opts

    def supports_reduce(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        return dtype in _GLOO_REDUCES  # shared memory could do int16, but a group may not have it

    def new_group(self, ranks: Sequence[int], group_id: int) -> Group:
        return self._make_group(ranks, f"ps{group_id}")

    def destroy_group(self, group: Group) -> None:
        if group.shm is not None:
            group.shm.close()
            group.shm = None
        handle, group.handle = group.handle, None
        if handle is not None:
            try:
                handle.shutdown()  # closes its connections now rather than at garbage collection
            except Exception as exc:  # already broken: nothing to close
                log.debug("rank %d: shutting down the Gloo group of ranks %s: %s", self.rank, group.ranks, exc)

    def interrupt(self, groups: Sequence[Group]) -> None:
        """Wake a thread blocked in a shared-memory step (its sockets are shut down); a Gloo
        call cannot be interrupted and returns at its timeout or when the peers leave."""
        for group in groups:
            if group.shm is not None:
                group.shm.interrupt()

    @staticmethod
    def _wait(work: Any, what: str, group: Group) -> None:
        try:
            work.wait()
        except Exception as exc:
            if "Invalid scalar type" in str(exc):
                # refused before anything moved, alike on every member (the dtype agreed in
                # negotiation): this op fails, the engine goes on
                raise DataError(f"gloo cannot {what} this dtype over ranks {group.ranks}: {exc}") from exc
            raise CollectiveError(f"gloo {what} over ranks {group.ranks} failed: {exc}") from exc

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        """Through shared memory among the members on one host (all of them, or per host
        then across hosts: :mod:`hora.native.backends.shm`), else through Gloo."""
        reducer = group.shm
        if reducer is not None and reducer.supports(buf, op):
            reducer.allreduce(buf, op)
        else:
            self._gloo_allreduce(buf, op, group)

    def allreduce_into(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group,
                       scale: float = 1.0) -> None:
        """Through shared memory the input goes straight into the segment and the result,
        scaled, straight into ``out``; else copy, Gloo in place, scale."""
        reducer = group.shm
        if reducer is not None and reducer.supports(out, op):
            reducer.allreduce(out, op, src=None if inp is out else inp, scale=scale)
        else:
            super().allreduce_into(out, inp, op, group, scale)

    def _gloo_allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        """Through Gloo, whatever the group's shared memory."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = torch_reduce_op(op)
        self._wait(group.handle.allreduce([buf], opts), "allreduce", group)

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> None:
        """A small gather among members on one host (a round's metadata, a pickled object)
        is a shared-memory Sum of bytes, each member's own in its place and zeros around
        them (exact: x + 0 = x); anything else through Gloo, whose round trip on loopback
        costs about 0.7 ms against tens of microseconds."""
        reducer = group.shm
        nbytes = out.numel() * out.element_size()
        if type(reducer) is shm.ShmReducer and nbytes <= SHM_GATHER_MAX_BYTES and out.is_contiguous() \
                and out.is_cpu and inp.is_cpu:
            b = out.view(-1).view(torch.uint8)
            n = nbytes // group.size
            b.zero_()
            if n:
                b[group.rank * n:(group.rank + 1) * n].copy_(inp.reshape(-1).view(torch.uint8))
            reducer.allreduce(b, ReduceOp.Sum)
            return
        self._wait(group.handle._allgather_base(_movable(out), _movable(inp)), "allgather", group)

    def broadcast(self, buf: torch.Tensor, root: int, group: Group) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self._wait(group.handle.broadcast([_movable(buf)], opts), "broadcast", group)

    def alltoall(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group
    ) -> None:
        opts = dist.AllToAllOptions()
        self._wait(group.handle.alltoall_base(_movable(out), _movable(inp), list(out_splits), list(in_splits), opts),
                   "alltoall", group)

    def reducescatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group) -> None:
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = torch_reduce_op(op)
        self._wait(group.handle._reduce_scatter_base(out, inp, opts), "reducescatter", group)

    def barrier(self, group: Group) -> None:
        self._wait(group.handle.barrier(dist.BarrierOptions()), "barrier", group)

    def make_waker(self) -> Waker:
        return StoreWaker(self._store, self._wait_store, self.rank, self.size)

    def shutdown(self) -> None:
        self.destroy_group(self.world)
        self._wait_store = None  # the stores' sockets (and rank 0's server) close with the last reference
        self._store = None
