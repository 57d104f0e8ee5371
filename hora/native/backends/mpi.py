"""MPI backend through mpi4py.

Chosen when the process was started by ``mpiexec`` (``hora run --mpi``) or by
``HORA_BACKEND=mpi``. Rank and size come from ``MPI.COMM_WORLD``; the local rank and
size from a ``COMM_TYPE_SHARED`` split, the cross rank/size from a split by local rank.
Buffers are handed to MPI as numpy views of the torch tensors (no copies). float16 and
bfloat16 have no portable MPI reduction, so the engine reduces them in float32
(``supports_reduce`` says so); bfloat16 moves as int16 bits.

MPI calls cannot be given a timeout, so a watchdog thread gives them one
(``HORA_COLLECTIVE_TIMEOUT``, default 300 s): a collective still waiting after that long
logs an error naming the ranks of its group that never joined it (each rank waiting in
a collective for a few seconds notes which call it waits in, in the engine store) and
aborts the job (``MPI_Abort``: mpiexec stops every rank), as torch's NCCL watchdog does.
A dead peer is detected by the MPI runtime (mpiexec aborts the job). The idle engine
threads wait on a TCPStore that rank 0 serves.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hora.errors import CollectiveError, ConfigError, RendezvousError
from hora.native.backends.base import Backend, Group, ReduceOp, StoreWaker, Waker
from hora.native.rendezvous import ENV_HOSTNAME

log = logging.getLogger(__name__)

_NO_NATIVE_REDUCE = (torch.float16, torch.bfloat16)
#: Seconds between the watchdog's error and its MPI_Abort, for mpiexec to relay the error.
ABORT_RELAY_S = 1.0


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ConfigError(f"the MPI backend needs mpi4py (pip install 'hora[mpi]'): {exc}") from None
    return MPI


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    if t.dtype == torch.bool:
        return t.view(torch.uint8).numpy()
    return t.numpy()


class MPIBackend(Backend):
    """Collectives on CPU tensors over an MPI communicator (a Dup of COMM_WORLD)."""

    name = "mpi"

    def __init__(self, comm: Any, store: Any, wait_store: Any, timeout: float = 300.0) -> None:
        self.MPI = _import_mpi()
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self.world = Group(range(self.size), self.rank, comm)
        self._store = store
        self._wait_store = wait_store
        local = comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        local_rank, local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(color=local_rank, key=self.rank)
        self.placement = (local_rank, local_size, cross.Get_rank(), cross.Get_size())
        local.Free()
        cross.Free()
        self.timeout = timeout
        self._calls: dict[tuple[int, ...], int] = {}  # group's ranks -> collectives started on them
        self._inflight: tuple[str, Group, float, int] | None = None  # what, group, since, call number
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="hora-mpi-watchdog", daemon=True)
        self._watchdog.start()
        self._ops = {
            ReduceOp.Sum: self.MPI.SUM,
            ReduceOp.Min: self.MPI.MIN,
            ReduceOp.Max: self.MPI.MAX,
            ReduceOp.Product: self.MPI.PROD,
        }

    @classmethod
    def from_environment(cls, timeout: float = 300.0) -> MPIBackend:
        """Initialise MPI (if needed) and connect the wake-up store.

        Raises:
            ConfigError: mpi4py is missing.
            RendezvousError: the store cannot be set up.
        """
        MPI = _import_mpi()
        import torch.distributed as dist

        comm = MPI.COMM_WORLD.Dup()
        rank, size = comm.Get_rank(), comm.Get_size()
        td = datetime.timedelta(seconds=timeout)
        store = wait_store = None
        err = None
        default_host = _default_host(comm, MPI)  # collective: every rank calls it
        if rank == 0:
            host = os.environ.get(ENV_HOSTNAME) or default_host
            try:
                store = dist.TCPStore(host, 0, None, True, td, wait_for_workers=False)
                addr = (host, store.port)
            except Exception as exc:  # tell the others instead of leaving them in bcast
                err = f"rank 0 cannot serve the engine store on {host}: {exc}"
                addr = None
        else:
            addr = None
        addr = comm.bcast((addr, err), root=0)
        if addr[1]:
            raise RendezvousError(addr[1])
        host, port = addr[0]
        try:
            if store is None:
                store = dist.TCPStore(host, port, None, False, td)
            wait_store = dist.TCPStore(host, port, None, False, td)
        except Exception as exc:
            raise RendezvousError(f"rank {rank}: cannot reach the engine store at {host}:{port}: {exc}") from exc
        comm.Barrier()
        log.debug("mpi backend: rank %d of %d, store %s:%d", rank, size, host, port)
        return cls(comm, store, wait_store, timeout)

    def supports_reduce(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        return dtype not in _NO_NATIVE_REDUCE

    def new_group(self, ranks: Sequence[int], group_id: int) -> Group:
        group = Group(ranks, self.rank)
        if group.is_member:
            grp = self.comm.Get_group().Incl(list(ranks))
            group.handle = self.comm.Create_group(grp, tag=group_id)
            grp.Free()
        return group

    def destroy_group(self, group: Group) -> None:
        if group.handle is not None and group.handle is not self.comm:
            group.handle.Free()
        group.handle = None

    def _run(self, what: str, group: Group, fn: Any, *args: Any, **kw: Any) -> None:
        key = tuple(group.ranks)  # as the notes in the store: the same on every member
        n = self._calls[key] = self._calls.get(key, 0) + 1
        self._inflight = (what, group, time.monotonic(), n)
        try:
            fn(*args, **kw)
        except self.MPI.Exception as exc:
            raise CollectiveError(f"MPI {what} over ranks {group.ranks} failed: {exc}") from exc
        finally:
            self._inflight = None

    # -- the watchdog ---------------------------------------------------------------------
    def _stuck_key(self, group: Group, rank: int) -> str:
        return f"hora/mpi/waiting/{'.'.join(map(str, group.ranks))}/{rank}"

    def _watch(self) -> None:
        """Note a collective that waits for long in the store; abort the job, naming the
        ranks that never joined it, once it has waited ``timeout`` seconds."""
        note_after = min(5.0, self.timeout / 2)
        noted = None
        while not self._stop.wait(min(1.0, note_after / 2)):
            inflight = self._inflight
            if inflight is None:
                continue
            what, group, since, n = inflight
            waited = time.monotonic() - since
            try:
                if waited >= note_after and noted is not inflight:
                    self._store.set(self._stuck_key(group, self.rank), f"{n} {what}")
                    noted = inflight
                if waited < self.timeout or self._inflight is not inflight:
                    continue
                time.sleep(note_after + 1.0)  # a rank that joined just now notes it too
                if self._inflight is not inflight:
                    continue
                missing, elsewhere = self._absent(group, n, what)
            except Exception as exc:  # the store is gone (shutdown): nothing to watch
                log.debug("mpi watchdog stops: %s", exc)
                return
            detail = f"ranks {missing} never joined it" if missing else "every rank joined it"
            if elsewhere:
                detail += "; " + ", ".join(f"rank {r} waits in {w}" for r, w in elsewhere.items())
            log.error("rank %d: MPI %s over ranks %s (call %d on that group) did not complete within "
                      "HORA_COLLECTIVE_TIMEOUT=%gs: %s. Aborting the job.", self.rank, what, group.ranks, n,
                      self.timeout, detail)
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            # mpiexec relays the ranks' output asynchronously and tears the job down at the
            # abort: give it a moment to pass the reason on, or the user sees nothing
            time.sleep(ABORT_RELAY_S)
            self.MPI.COMM_WORLD.Abort(1)
            return

    def _absent(self, group: Group, n: int, what: str) -> tuple[list[int], dict[int, str]]:
        """(ranks that have not noted call ``n`` of ``group``, {rank: the call it waits in
        instead}) from the notes in the store."""
        missing: list[int] = []
        elsewhere: dict[int, str] = {}
        for r in group.ranks:
            key = self._stuck_key(group, r)
            note = self._store.get(key).decode() if self._store.check([key]) else ""
            num, _, w = note.partition(" ")
            if not note or int(num) < n:
                missing.append(r)
            elif int(num) > n or w != what:
                elsewhere[r] = f"call {num} ({w})"
        return missing, elsewhere

    def allreduce(self, buf: torch.Tensor, op: ReduceOp, group: Group) -> None:
        if buf.dtype in _NO_NATIVE_REDUCE:
            raise CollectiveError(f"MPI cannot reduce {buf.dtype}; the engine should have upcast it")
        self._run("allreduce", group, group.handle.Allreduce, self.MPI.IN_PLACE, _np(buf), op=self._ops[op])

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> None:
        self._run("allgather", group, group.handle.Allgather, _np(inp), _np(out))

    def broadcast(self, buf: torch.Tensor, root: int, group: Group) -> None:
        self._run("broadcast", group, group.handle.Bcast, _np(buf), root=root)

    def alltoall(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group
    ) -> None:
        row = 1
        for d in inp.shape[1:]:
            row *= d
        sc = [s * row for s in in_splits]
        rc = [s * row for s in out_splits]
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(int).tolist()
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(int).tolist()
        self._run("alltoall", group, group.handle.Alltoallv, [_np(inp).reshape(-1), (sc, sd)],
                  [_np(out).reshape(-1), (rc, rd)])

    def reducescatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp, group: Group) -> None:
        if inp.dtype in _NO_NATIVE_REDUCE:
            super().reducescatter(out, inp, op, group)
            return
        self._run("reducescatter", group, group.handle.Reduce_scatter_block, _np(inp).reshape(-1),
                  _np(out).reshape(-1), op=self._ops[op])

    def barrier(self, group: Group) -> None:
        self._run("barrier", group, group.handle.Barrier)

    def make_waker(self) -> Waker:
        return StoreWaker(self._store, self._wait_store, self.rank, self.size)

    def shutdown(self) -> None:
        self._stop.set()
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                comm.Free()
            except Exception:  # already finalized at interpreter exit
                pass
        self._store = self._wait_store = None


def _default_host(comm: Any, MPI: Any) -> str:
    """127.0.0.1 when every rank shares this host, else this host's address."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    all_local = local.Get_size() == comm.Get_size()
    local.Free()
    if all_local:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())
