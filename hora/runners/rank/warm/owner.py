"""Whom a warm rank server serves and follows (:class:`Owner`): the process that asked for it, a Spark
executor's JVM (found from a Python worker through its pyspark daemon), or the caller of ``hora run``."""

from __future__ import annotations

import dataclasses
import os

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
            with torch imported instead of waiting for a new server's imports. None elsewhere.
        keeper: the executor's parent (the standalone Worker, a YARN container's launcher):
            the server ends at once with it. None without ``app``.
    """

    pid: int
    app: str | None = None
    keeper: int | None = None


def owner() -> Owner:
    """The :class:`Owner` of a server started from here: this process, or, in a Python worker
    of a Spark executor (forked by pyspark's daemon), the executor's JVM.

    Spark runs each task in whichever of its Python workers is free, and may keep more than
    one daemon per executor (one per worker-factory key), so a server owned by a worker or
    a daemon would be found only by the tasks that happen to run there; owned by the
    executor, it serves every task of the executor (and :func:`prestart` can start it from
    any of them before the training stage).
    """
    try:
        parent, daemon_parent = _cmdline_and_parent(os.getppid())
        if b"pyspark.daemon" not in parent[:4]:
            return Owner(os.getpid())
        executor, keeper = _cmdline_and_parent(daemon_parent)
    except (OSError, ValueError, IndexError):
        return Owner(os.getpid())
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
