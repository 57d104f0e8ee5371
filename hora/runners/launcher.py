"""Job, Launcher and the table of hora's launchers by name.

A :class:`Launcher` knows how to start the ranks of one :class:`~hora.runners.spec.LaunchSpec`
somewhere (processes on this machine and on ssh hosts, mpiexec, one Spark barrier stage,
pinned Dask tasks, Ray actors) and returns a :class:`Job`. Everything else is shared
(:mod:`hora.runners.api`): the driver service the ranks report to, the one monitor
(:mod:`hora.runners.driver.monitor`: first failure, ranks that never start, hang or die)
and the teardown.

A launcher is not a collective *backend* (Gloo, NCCL, MPI: :mod:`hora.native.backends`);
``backend=`` of :func:`hora.runners.run` keeps Horovod's spelling for the launcher's name.
"""

from __future__ import annotations

import abc
import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hora.errors import ConfigError
from hora.runners.spec import ENV_ADVERTISE_ADDR, LaunchSpec

if TYPE_CHECKING:
    from hora.runners.driver.faults import Failure
    from hora.runners.driver.service import DriverService

#: hora's launchers by ``backend=`` name: ``"module:Class"``, imported only when named
#: (pyspark, distributed and ray stay unimported until a run asks for them).
BUILTIN: dict[str, str] = {
    "local": "hora.runners.launchers.local:LocalLauncher",
    "hosts": "hora.runners.launchers.hosts:HostsLauncher",
    "mpi": "hora.runners.launchers.mpi:MpiLauncher",
    "spark": "hora.runners.launchers.spark:SparkLauncher",
    "dask": "hora.runners.launchers.dask:DaskLauncher",
    "ray": "hora.runners.launchers.ray.launcher:RayLauncher",
}

#: the launchers ``backend="<name>"`` builds without arguments of its own (hosts and mpi
#: need a host list: pass an instance, e.g. ``HostsLauncher("a:2,b:2")``).
_BY_NAME = ("local", "spark", "dask", "ray")


def launcher_class(name: str) -> type[Launcher]:
    """The class of a launcher of :data:`BUILTIN`, imported now.

    Raises:
        ConfigError: an unknown launcher name.
    """
    if name not in BUILTIN:
        raise ConfigError(f"launcher {name!r} is unknown; hora's are {', '.join(sorted(BUILTIN))}")
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


class Job(abc.ABC):
    """The ranks of one run, started by a :class:`Launcher`; the monitor polls it."""

    @abc.abstractmethod
    def poll(self) -> list[Any] | None:
        """The per-rank results in rank order once every rank returned, else None.

        Raises:
            WorkerFailedError: the engine reports a failed rank, task or worker.
        """

    def failures(self) -> list[Failure]:
        """Failures the launcher itself observed (rank exits, lost hosts), numbered by
        the driver service's failure counter."""
        return []

    def ended(self) -> set[int]:
        """Ranks whose process is known to have ended successfully (the monitor stops
        waiting for a root cause once every rank failed or ended)."""
        return set()

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop every rank and wait until their processes are gone (idempotent)."""

    def host_of(self, rank: int) -> str | None:
        """The host a rank runs on, if known."""
        return None


def start_or_cancel(job: Any) -> Any:
    """``job.start()``; on any error (or Ctrl-C) ``job.cancel()`` first, then re-raise."""
    try:
        job.start()
    except BaseException:
        job.cancel()
        raise
    return job


class Launcher(abc.ABC):
    """Where ranks run. Subclasses: :class:`~hora.runners.launchers.local.LocalLauncher`,
    :class:`~hora.runners.launchers.hosts.HostsLauncher`, :class:`~hora.runners.launchers.mpi.MpiLauncher`, :class:`~hora.runners.launchers.spark.SparkLauncher`,
    :class:`~hora.runners.launchers.dask.DaskLauncher`."""

    name = "launcher"

    #: True when :meth:`prestart` takes the cluster's task slots for a while (Spark: a short
    #: job), so a run started right after it waits for them: the estimators then prestart only
    #: when there is work to overlap it with (the data is being written), not before a run
    #: whose data is already materialized.
    prestart_takes_slots: bool = False

    @abc.abstractmethod
    def default_num_proc(self) -> int:
        """The number of ranks when ``num_proc`` is not given."""

    def check_num_proc(self, num_proc: int) -> None:
        """Fail at once when the launcher cannot run ``num_proc`` ranks together.

        Raises:
            ConfigError: not enough free slots (the message says how many there are).
        """

    def refresh_slots(self) -> None:
        """Forget what the launcher remembers about the cluster's free slots: a lost
        executor or worker changes them (called before every relaunch check)."""

    def driver_addresses(self) -> tuple[str, str]:
        """``(bind, advertise)``: where the driver service listens and how ranks reach it."""
        adv = os.environ.get(ENV_ADVERTISE_ADDR) or "127.0.0.1"
        return ("127.0.0.1" if adv.startswith("127.") else "0.0.0.0", adv)

    def prestart(self, num_proc: int, env: Mapping[str, str]) -> None:
        """Prepare, without waiting, what the ranks of a coming run will need (the estimators
        call it while they materialize the data): e.g. start the warm rank servers where the
        ranks will run. Never raises; the default does nothing."""

    @abc.abstractmethod
    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        """Start ``spec.num_proc`` ranks; return the running :class:`Job`."""


def resolve_launcher(launcher: str | Launcher, *, spark: Any = None, client: Any = None) -> Launcher:
    """Turn ``"local"``, ``"spark"``, ``"dask"``, ``"ray"`` or a :class:`Launcher` into a Launcher.

    Raises:
        ConfigError: an unknown launcher name.
    """
    if isinstance(launcher, Launcher):
        return launcher
    if launcher not in _BY_NAME:
        raise ConfigError(f"backend {launcher!r} is unknown; use 'local', 'spark', 'dask', 'ray' or a hora.runners.Launcher")
    cls: Any = launcher_class(launcher)
    if launcher == "spark":
        return cls(spark)
    if launcher == "dask":
        return cls(client)
    return cls()
