"""Backend selection: Gloo (torch.distributed), NCCL (CUDA tensors), MPI (mpi4py).

:func:`create_backend` reads the environment and returns the CPU backend the engine
negotiates over. See :func:`hora.native.init` for the rules.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from hora import settings
from hora.native.rendezvous import ENV_RANK, ENV_RENDEZVOUS_ADDR
from hora.settings import ENV_BACKEND
from hora.native import keys
from hora.native.backends.base import Backend, Group, ReduceOp, Waker

log = logging.getLogger(__name__)

BACKENDS = settings.BACKENDS
MPI_LAUNCH_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
ENV_COLLECTIVE_TIMEOUT = "HORA_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = settings.default(ENV_COLLECTIVE_TIMEOUT)
# per job id: the generation this process joined last (init, shutdown, init, ...); an elastic
# run gives each membership round its own job id, whose generations start afresh
_LAST_GENERATION: dict[str, int] = {}


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by mpiexec/mpirun."""
    env = os.environ if environ is None else environ
    return any(env.get(v) for v in MPI_LAUNCH_VARS)


def requested_backend(environ: Mapping[str, str] | None = None) -> str:
    """The backend asked for by ``HORA_BACKEND`` (default auto).

    Raises:
        ConfigError: an unknown backend name.
    """
    return settings.get(ENV_BACKEND, environ)


def choose_backend(environ: Mapping[str, str] | None = None) -> str:
    """Resolve ``auto``: "mpi" under mpiexec without a hora rendezvous, else "gloo"
    (``nccl`` also negotiates over Gloo; CUDA tensors then go through NCCL)."""
    env = os.environ if environ is None else environ
    name = requested_backend(env)
    if name == "auto":
        return "mpi" if launched_by_mpi(env) and not env.get(ENV_RENDEZVOUS_ADDR) else "gloo"
    return name


def collective_timeout() -> float:
    """``HORA_COLLECTIVE_TIMEOUT``: seconds a backend collective waits for its peers."""
    return settings.get(ENV_COLLECTIVE_TIMEOUT)


def create_backend() -> tuple[Backend, tuple[int, int, int, int], list[Any]]:
    """Build the CPU backend for this process from the environment.

    Returns (backend, (local_rank, local_size, cross_rank, cross_size), objects to close).

    Raises:
        ConfigError: unknown backend, missing/malformed HORA_* variables, mpi4py missing.
        RendezvousError: peers never arrived.
    """
    name = choose_backend()
    timeout = collective_timeout()
    if name == "mpi":
        from hora.native.backends.mpi import MPIBackend

        be = MPIBackend.from_environment(timeout=timeout)
        return be, be.placement, []
    from hora.native.backends.gloo import GlooBackend, make_stores

    if not os.environ.get(ENV_RANK) and not os.environ.get(ENV_RENDEZVOUS_ADDR):
        # a one-process job started without a launcher: no network at all
        import torch.distributed as dist

        store = dist.HashStore()
        be = GlooBackend(0, 1, store=store, wait_store=store, hostname="127.0.0.1", timeout=timeout)
        return be, (0, 1, 0, 1), []
    from hora.native.rendezvous import KVClient, WorkerEnv, barrier

    env = WorkerEnv.from_environ()
    kv = KVClient(env.rendezvous_addr, env.secret)
    # Meet every rank first, bounded by HORA_START_TIMEOUT: a rank that never starts is
    # then named by the barrier (RendezvousError) instead of surfacing, much later, as a
    # Gloo connect timeout (HORA_COLLECTIVE_TIMEOUT) while the group is being built.
    try:
        gen = join_generation(kv, env.job_id, env.rank, env.start_timeout)
        barrier(kv, keys.native_init_barrier(env.job_id, gen), env.rank, env.size, env.start_timeout)
        key = keys.native_collective_store(env.job_id, gen)
        store, wait_store = make_stores(env.rank, env.size, env.hostname, kv, key, env.start_timeout)
        be = GlooBackend(env.rank, env.size, store=store, wait_store=wait_store, hostname=env.hostname,
                         timeout=timeout)
    except BaseException:
        kv.close()
        raise
    if env.rank == 0:
        # every rank has read the key: building the Gloo group needed all of them
        try:
            kv.delete(key)
        except Exception:  # the key is only a hint; a later init publishes a new one
            pass
    return be, (env.local_rank, env.local_size, env.cross_rank, env.cross_size), [kv]


def join_generation(kv: Any, job_id: str, rank: int, timeout: float) -> int:
    """The job generation this init joins: every ``init`` after a ``shutdown`` builds its
    stores and groups under a new one, so nothing of an earlier init is ever reached.

    Rank 0 opens the next generation (an atomic counter on the rendezvous store); the
    other ranks join the newest one opened since they last joined, waiting for it when
    rank 0 has not opened it yet. A rank that skipped a generation (it never shut down
    the engine of the one before) thus meets the others in the current one rather than
    in one they have left.

    Raises:
        RendezvousError: rank 0 opened no new generation within ``timeout`` seconds.
    """
    last = _LAST_GENERATION.get(job_id, 0)
    if rank == 0:
        gen = kv.add(keys.native_generation(job_id), 1)
        kv.set(keys.native_generation_open(job_id, gen), b"open")
    else:
        gen = kv.add(keys.native_generation(job_id), 0)  # the newest generation rank 0 has opened
        if gen <= last:
            gen = last + 1
            try:
                kv.wait([keys.native_generation_open(job_id, gen)], timeout)
            except Exception as exc:
                from hora.errors import RendezvousError

                raise RendezvousError(f"rank {rank}: rank 0 did not start generation {gen} of the job within "
                                      f"{timeout:g}s (did it call hora.init()?): {exc}") from None
    _LAST_GENERATION[job_id] = gen
    return gen


__all__ = ["Backend", "Group", "ReduceOp", "Waker", "create_backend", "choose_backend", "launched_by_mpi",
           "requested_backend", "BACKENDS"]
