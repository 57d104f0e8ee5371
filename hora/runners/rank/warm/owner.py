"""Whom a warm rank server serves and follows (:class:`Owner`): the process that asked for it, a Spark
executor's JVM (found from a Python worker through its pyspark daemon), a Dask worker process under a
nanny (its server outlives it and serves the worker the nanny starts in its place), or the caller of
``hora run``."""

from __future__ import annotations

import dataclasses
import os
import sys

from hora.pids import cmdline_arg


def _cmdline_and_parent(pid: int) -> tuple[list[bytes], int]:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmdline = fh.read().split(b"\0")
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return cmdline, int(stat[stat.rindex(b")") + 2:].split()[1])  # the field after the state: ppid


@dataclasses.dataclass(frozen=True)
class Owner:
    """Whom a server started from here serves and follows.

    Attributes:
        pid: the process whose life the server follows (:func:`owner_pid`).
        app: for a Spark executor's JVM, ``"<application id>@<executor host>"`` (its
            ``--app-id`` and ``--hostname``): the server is then found by that name, not by
            the pid, and outlives its executor: when the executor dies (a lost executor: the
            cluster manager starts another one for the same application on the same host),
            the server kills that executor's ranks and passes to the replacement
            (:data:`hora.runners.rank.warm.server.ORPHAN_WAIT`), so the relaunched ranks fork
            with torch imported instead of waiting for a new server's imports. For a Dask
            worker process under a nanny, ``"dask:<worker name>@<nanny address>"`` (:data:`DASK_APP`):
            the nanny starts a worker of the same name in place of one that died, and that
            worker's first rank request (its pid as the request's owner) takes the server over.
            None elsewhere.
        keeper: the executor's parent (the standalone Worker, a YARN container's launcher), or
            the process that runs the Dask worker's nanny: the server ends at once with it.
            None without ``app``.
    """

    pid: int
    app: str | None = None
    keeper: int | None = None


#: the prefix of a Dask worker's :attr:`Owner.app`
DASK_APP = "dask:"


def dask_worker_owner() -> Owner | None:
    """The :class:`Owner` of a server started in a Dask worker process that a nanny runs (its
    parent): this process, known by its worker's name and nanny; None in any other process (no
    ``distributed`` imported, no worker, or a worker without a nanny, whose death is the end)."""
    worker_module = sys.modules.get("distributed.worker")
    if worker_module is None:
        return None
    try:
        workers = list(worker_module.Worker._instances)
    except (AttributeError, TypeError):
        return None
    if len(workers) != 1 or not getattr(workers[0], "nanny", None) or os.getppid() <= 1:
        return None
    worker = workers[0]
    return Owner(os.getpid(), f"{DASK_APP}{worker.name}@{worker.nanny}", os.getppid())


def owner() -> Owner:
    """The :class:`Owner` of a server started from here: this process, or, in a Python worker
    of a Spark executor (forked by pyspark's daemon), the executor's JVM; in a Dask worker
    process under a nanny, this process known by its worker's name (:func:`dask_worker_owner`).

    Spark runs each task in whichever of its Python workers is free, and may keep more than
    one daemon per executor (one per worker-factory key), so a server owned by a worker or
    a daemon would be found only by the tasks that happen to run there; owned by the
    executor, it serves every task of the executor (and :func:`prestart` can start it from
    any of them before the training stage).
    """
    try:
        parent, daemon_parent = _cmdline_and_parent(os.getppid())
        if b"pyspark.daemon" not in parent[:4]:
            return dask_worker_owner() or Owner(os.getpid())
        executor, keeper = _cmdline_and_parent(daemon_parent)
    except (OSError, ValueError, IndexError):
        return dask_worker_owner() or Owner(os.getpid())
    if not executor or os.path.basename(executor[0]) != b"java":
        return Owner(os.getppid())
    app, host = cmdline_arg(executor, b"--app-id"), cmdline_arg(executor, b"--hostname")
    if app and host:  # an executor (standalone, YARN, Kubernetes); a local master's driver JVM has neither
        return Owner(daemon_parent, f"{app}@{host}", keeper)
    return Owner(daemon_parent)


def owner_pid() -> int:
    """The process whose life a server started from here follows (:func:`owner`)."""
    return owner().pid


def command_owner() -> Owner:
    """The owner of a ``hora run`` command rank's server: the process that started ``hora
    run`` (a shell, a test runner), so that its next ``hora run`` forks from the same server
    with everything imported; this process when it has no parent but init."""
    parent = os.getppid()
    return Owner(parent) if parent > 1 else Owner(os.getpid())
