"""NCCL backend for CUDA tensors: torch.distributed's ProcessGroupNCCL, used directly.

The engine always negotiates over the CPU backend (Gloo); when a request's tensor is on
a CUDA device it executes the agreed collective with this backend instead. Groups are
created lazily, on first use, by every member in the same (agreed) order. The engine
thread waits for the producer stream of each input (an event recorded at submission)
and for the NCCL work before it completes a handle, so results are ready when
``synchronize()`` returns.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hora.errors import CollectiveError, ConfigError
from hora.native.backends.base import Backend, Group, ReduceOp, Waker
from hora.native.backends.gloo import torch_reduce_op

log = logging.getLogger(__name__)


def nccl_available() -> bool:
    """Whether this torch build has NCCL and a CUDA device is visible."""
    return bool(dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available())


class NcclBackend(Backend):
    """Collectives on CUDA tensors through ProcessGroupNCCL (no negotiation of its own)."""

    name = "nccl"

    def __init__(self, rank: int, size: int, *, store: Any, local_rank: int = 0, timeout: float = 300.0) -> None:
        if not nccl_available():
            raise ConfigError("the NCCL backend needs a CUDA build of torch with NCCL and a visible GPU")
        super().__init__(rank, size)
        self._store = store
        self._timeout = datetime.timedelta(seconds=timeout)
        self.device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        self.world = self._make_group(range(size), "world")

    def _make_group(self, ranks: Sequence[int], tag: str) -> Group:
        group = Group(ranks, self.rank)
        if not group.is_member:
            return group
        opts = dist.ProcessGroupNCCL.Options()
        try:
            opts._timeout = self._timeout
        except AttributeError:  # older option objects have no timeout field
            pass
        prefix = dist.PrefixStore(f"hora/nccl/{tag}/", self._store)
        try:
            group.handle = dist.ProcessGroupNCCL(prefix, group.rank, group.size, opts)
        except Exception as exc:
            raise CollectiveError(f"rank {self.rank}: cannot create NCCL group {tag} of ranks {list(ranks)}: {exc}") from exc
        return group

    def new_group(self, ranks: Sequence[int], group_id: int) -> Group:
        return self._make_group(ranks, f"ps{group_id}")

    def destroy_group(self, group: Group) -> None:
        group.handle = None

    def _wait(self, work: Any, what: str, group: Group, tensor: torch.Tensor) -> None:
        try:
            work.wait()
            torch.cuda.synchronize(tensor.device)
        except Exception as exc:
            raise CollectiveError(f"NCCL {what} over ranks {group.ranks} failed: {exc}") from exc

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = torch_reduce_op(op)
        self._wait(group.handle.allreduce([buf], opts), "allreduce", group, buf)

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> None:
        self._wait(group.handle._allgather_base(out, inp), "allgather", group, out)

    def broadcast(self, buf: torch.Tensor, root: int, group: Group) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self._wait(group.handle.broadcast([buf], opts), "broadcast", group, buf)

    def alltoall(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group
    ) -> None:
        opts = dist.AllToAllOptions()
        self._wait(group.handle.alltoall_base(out, inp, list(out_splits), list(in_splits), opts), "alltoall",
                   group, out)

    def reducescatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group) -> None:
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = torch_reduce_op(op)
        self._wait(group.handle._reduce_scatter_base(out, inp, opts), "reducescatter", group, out)

    def barrier(self, group: Group) -> None:
        t = torch.zeros(1, device=self.device)
        self.allreduce(t, ReduceOp.Sum, group)

    def make_waker(self) -> Waker:
        raise CollectiveError("the NCCL backend does not negotiate; the engine uses the CPU backend's waker")

    def shutdown(self) -> None:
        self.world.handle = None
        self._store = None
