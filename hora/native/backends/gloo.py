"""Gloo backend: torch.distributed's ProcessGroupGloo, used directly.

hora does not touch torch.distributed's default group: it builds its own
``ProcessGroupGloo`` objects over a ``TCPStore`` that rank 0 creates on a free port and
publishes through the job's authenticated rendezvous store. The Gloo device is bound to
the worker's advertised address (``HORA_HOSTNAME``), never to whatever the machine's
hostname resolves to.

Allreduce among ranks that share one host goes through shared memory instead of Gloo's
TCP loopback (:mod:`hora.native.backends.shm`; ``HORA_SHM_ALLREDUCE=0`` turns it off):
4-5x less CPU per byte, which a CPU-bound training job gets back as compute time.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hora.errors import CollectiveError, RendezvousError
from hora.native.backends.base import Backend, Group, ReduceOp, StoreWaker, Waker
from hora.native.backends.shm import ShmReducer

log = logging.getLogger(__name__)

_TORCH_OPS = {
    ReduceOp.Sum: dist.ReduceOp.SUM,
    ReduceOp.Min: dist.ReduceOp.MIN,
    ReduceOp.Max: dist.ReduceOp.MAX,
    ReduceOp.Product: dist.ReduceOp.PRODUCT,
}

_GLOO_NO_REDUCE = frozenset({torch.int16})  # "Invalid scalar type" (torch 2.13)


def _movable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a dtype Gloo moves: int16 travels as float16 bits (moved, never computed on)."""
    return t.view(torch.float16) if t.dtype == torch.int16 else t


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
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self._hostname)]
        opts._timeout = self._timeout
        prefix = dist.PrefixStore(f"hora/pg/{tag}/", self._store)
        try:
            group.handle = dist.ProcessGroupGloo(prefix, group.rank, group.size, opts)
        except Exception as exc:
            raise CollectiveError(
                f"rank {self.rank}: cannot connect Gloo group {tag} of ranks {list(ranks)}: {exc}"
            ) from exc
        group.shm = ShmReducer.connect(group, dist.PrefixStore(f"hora/shm/{tag}/", self._store),
                                       lambda flag: self._gloo_allreduce(flag, ReduceOp.Sum, group),
                                       self._timeout.total_seconds())
        return group

    def supports_reduce(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        return dtype not in _GLOO_NO_REDUCE  # shared memory could, but a group may not have it

    def new_group(self, ranks: Sequence[int], group_id: int) -> Group:
        return self._make_group(ranks, f"ps{group_id}")

    def destroy_group(self, group: Group) -> None:
        if group.shm is not None:
            group.shm.close()
            group.shm = None
        group.handle = None

    @staticmethod
    def _wait(work: Any, what: str, group: Group) -> None:
        try:
            work.wait()
        except Exception as exc:
            raise CollectiveError(f"gloo {what} over ranks {group.ranks} failed: {exc}") from exc

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        """Through shared memory when every member is on this host (see
        :mod:`hora.native.backends.shm`), else through Gloo."""
        shm = group.shm
        if shm is not None and shm.supports(buf, op):
            shm.allreduce(buf, op)
        else:
            self._gloo_allreduce(buf, op, group)

    def _gloo_allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = torch_reduce_op(op)
        self._wait(group.handle.allreduce([buf], opts), "allreduce", group)

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> None:
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
        self._wait_store = None
        self._store = None
