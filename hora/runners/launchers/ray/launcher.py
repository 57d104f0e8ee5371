"""Ray launcher: each rank is a Ray actor in one placement group.

``hora.runners.run(fn, num_proc=4, backend="ray")`` or, with resources per rank,
``backend=RayLauncher(cpus_per_rank=2, gpus_per_rank=1, strategy="SPREAD")``.

The placement group (:mod:`hora.runners.launchers.ray.placement`) has one bundle per rank (``PACK``,
``SPREAD``, ``STRICT_PACK`` or ``STRICT_SPREAD``); a request the cluster can never hold
fails at once, one that other jobs keep from being scheduled after ``placement_timeout``,
both naming what was asked and what the cluster has. One :class:`~hora.runners.launchers.ray.workers.RankActor`
per bundle (:mod:`hora.runners.launchers.ray.workers`) runs its rank in its own process; ``local_rank``,
``local_size`` and ``cross_rank`` follow the actors' nodes, and ranks on one node use
shared memory. The rendezvous is the run's driver service, on loopback when every Ray
node is this machine.

Failures go through the one monitor (:mod:`hora.runners.driver.monitor`): a rank that raised
(its own report, with the traceback), and an actor that died (``ray.kill``, its process
killed, its node lost), reported as lost the moment Ray tells.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable, Mapping
from typing import Any

from hora import settings
from hora.errors import ConfigError, WorkerFailedError
from hora.runners.launchers.ray.placement import (
    DEFAULT_PLACEMENT_TIMEOUT,
    ENV_PLACEMENT_TIMEOUT,
    STRATEGIES,
    RayResources,
    capacity,
    check_capacity,
    require_ray,
)
from hora.runners.launchers.ray.workers import RankActor, RayWorkerGroup, first_line
from hora.runners.launcher import Job, Launcher, start_or_cancel
from hora.runners.driver.service import DriverService
from hora.runners.driver.faults import FaultKind, kind_of_exit
from hora.runners.driver.monitor import Failure
from hora.runners.network import is_loopback
from hora.runners.spec import (
    ENV_ADVERTISE_ADDR,
    ENV_TERMINATE_GRACE,
    LaunchSpec,
    RankContext,
)

log = logging.getLogger(__name__)


def service_addresses(ray: Any) -> tuple[str, str]:
    """``(bind, advertise)`` of the driver service: loopback when every Ray node is this
    driver's node or on a loopback address, else the driver node's IP."""
    override = os.environ.get(ENV_ADVERTISE_ADDR)
    if override:
        return ("127.0.0.1" if is_loopback(override) else "0.0.0.0", override)
    me = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if all(n.get("NodeID") == me or is_loopback(n.get("NodeManagerAddress", "")) for n in nodes):
        return ("127.0.0.1", "127.0.0.1")
    return ("0.0.0.0", ray.util.get_node_ip_address())


def _wait_process_end(pid: int, stop: threading.Event) -> bool:
    """Block until process ``pid`` (not a child) ends (True) or ``stop`` is set (False)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):  # no pidfd (old kernel, not Linux): poll
        while not stop.wait(0.05):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        return False
    try:
        while not stop.is_set():
            if select.select([fd], [], [], 0.2)[0]:
                return True
        return False
    finally:
        os.close(fd)


class RayJob(Job):
    """One run's ranks as calls on a :class:`RayWorkerGroup`'s actors."""

    def __init__(self, spec: LaunchSpec, service: DriverService, *, make_group: Callable[[], RayWorkerGroup] | None,
                 group: RayWorkerGroup | None = None, loopback: bool = True) -> None:
        self.spec = spec
        self.service = service
        self._make_group = make_group
        self.group = group
        self.owns_group = group is None
        self.loopback = loopback
        self.refs: list[Any] = []
        self.contexts: list[RankContext] = []
        self._results: dict[int, Any] = {}
        self._failures: list[Failure] = []
        self._seen: set[int] = set()
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        self._cancelled = False
        self._stop_watching = threading.Event()
        self.started = threading.Event()  # the rank calls are submitted (RayExecutor.run_remote)

    def start(self) -> None:
        if self.group is None:
            assert self._make_group is not None
            self.group = self._make_group()
        if self.group.stopped:
            raise ConfigError("the Ray workers were stopped (shutdown()); start them again")
        if self.group.num_proc != self.spec.num_proc:
            raise ConfigError(f"num_proc={self.spec.num_proc}, but the Ray worker group has {self.group.num_proc} actors")
        self.contexts = self.group.contexts(self.service.addr, self.loopback)
        self.refs = [a.run.remote(self.spec, ctx) for a, ctx in zip(self.group.actors, self.contexts)]
        here = self.group.ray.get_runtime_context().get_node_id()
        for rank, info in enumerate(self.group.infos):
            if info.node_id == here:
                threading.Thread(target=self._watch_process, args=(rank, info.pid), name=f"hora-ray-watch-{rank}",
                                 daemon=True).start()
        self.started.set()

    def _watch_process(self, rank: int, pid: int) -> None:
        """Record a rank as lost the moment its actor's process on this machine ends: sooner
        than Ray's notice, and so before its peers report the broken collective."""
        if not _wait_process_end(pid, self._stop_watching):
            return
        with self._lock:
            if self._cancelled or rank in self._seen or rank in self._lost:
                return
            self._lost.add(rank)
            self._failures.append(Failure(seq=self.service.next_seq(), rank=rank, host=self.host_of(rank),
                                          message=f"was lost: its Ray actor's process (pid {pid} on this machine) "
                                                  "died", kind=FaultKind.LOST))

    def host_of(self, rank: int) -> str | None:
        return self.contexts[rank].hostname if 0 <= rank < len(self.contexts) else None

    def _check(self) -> None:
        if not self.refs:
            return
        ready, _ = self.group.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        ready_set = set(ready)
        for rank, ref in enumerate(self.refs):
            if rank in self._seen or ref not in ready_set:
                continue
            try:
                value = self.group.ray.get(ref, timeout=0)
            except Exception as exc:
                with self._lock:
                    self._seen.add(rank)
                    if not self._cancelled and rank not in self._lost:
                        self._failures.append(self._failure(rank, exc))
                continue
            with self._lock:
                self._seen.add(rank)
                self._results[rank] = value

    def _failure(self, rank: int, exc: BaseException) -> Failure:
        from ray.exceptions import RayActorError

        seq = self.service.next_seq()
        host = self.host_of(rank)
        cause = getattr(exc, "cause", None) or exc  # a RayTaskError carries the actor's exception
        if isinstance(cause, WorkerFailedError):  # the actor's account of its rank process's exit
            kind = FaultKind.ERROR if cause.exitcode is None else kind_of_exit(cause.exitcode, cause.remote_traceback)
            return Failure(seq=seq, rank=rank, host=host, message=f"failed: {cause.message}",
                           traceback=cause.remote_traceback, exitcode=cause.exitcode, kind=kind)
        info = self.group.infos[rank] if self.group and rank < len(self.group.infos) else None
        where = f" (pid {info.pid} on node {info.node_ip}, id {info.node_id[:12]})" if info else ""
        if isinstance(exc, RayActorError):
            return Failure(seq=seq, rank=rank, host=host, message=f"was lost: its Ray actor{where} died: "
                                                                  f"{first_line(exc)}", kind=FaultKind.LOST)
        return Failure(seq=seq, rank=rank, host=host, message=f"failed in its Ray actor{where}: {first_line(exc)}",
                       traceback=str(exc))

    def poll(self) -> list[Any] | None:
        self._check()
        if not self._failures and len(self._results) == len(self.refs) and self.refs:
            return [self._results[r] for r in range(len(self.refs))]
        return None

    def failures(self) -> list[Failure]:
        self._check()
        with self._lock:
            return list(self._failures)

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
        self._stop_watching.set()
        if self.group is None:
            return
        pending = [r for i, r in enumerate(self.refs) if i not in self._seen]
        if self.owns_group:
            self.group.stop(pending)
            return
        # borrowed actors (RayExecutor): the driver's abort ends ranks still running; kill the rest
        if pending:
            grace = float(settings.get(ENV_TERMINATE_GRACE))
            _, still = self.group.ray.wait(pending, num_returns=len(pending), timeout=grace + 5)
            for rank, ref in enumerate(self.refs):
                if ref in still:
                    log.warning("rank %d of run %s did not stop at the abort; killing its Ray actor", rank,
                                self.spec.run_id)
                    with contextlib.suppress(Exception):
                        self.group.ray.kill(self.group.actors[rank], no_restart=True)


class RayLauncher(Launcher):
    """Ranks as Ray actors in a placement group (see the module docstring).

    Args:
        cpus_per_rank, gpus_per_rank, resources_per_rank, strategy: see :class:`RayResources`.
        placement_timeout: seconds for the placement group (default
            ``HORA_RAY_PLACEMENT_TIMEOUT`` or 100).
        workers: run on these existing actors instead (:class:`hora.ray.RayExecutor`'s);
            they outlive the run.
        placement_group: start the actors in this existing placement group (any bundle).

    Raises:
        ImportError: Ray is missing. ConfigError: a bad resource or strategy.
    """

    name = "ray"

    def __init__(self, *, cpus_per_rank: float = 1, gpus_per_rank: float = 0,
                 resources_per_rank: Mapping[str, float] | None = None, strategy: str = "PACK",
                 placement_timeout: float | None = None, workers: RayWorkerGroup | None = None,
                 placement_group: Any = None, ranks_per_bundle: int = 1) -> None:
        if placement_timeout is None:
            placement_timeout = float(settings.get(ENV_PLACEMENT_TIMEOUT))
        if resources_per_rank is not None and not isinstance(resources_per_rank, Mapping):
            raise ConfigError(f"resources_per_rank must be a mapping of resource names to amounts, "
                              f"got {type(resources_per_rank).__name__}")
        self.resources = RayResources(cpus_per_rank, gpus_per_rank, tuple(sorted((resources_per_rank or {}).items())),
                                      strategy,
                                      ranks_per_bundle, placement_timeout)
        self.workers = workers
        self.placement_group = placement_group
        self.ray = require_ray()
        self._addresses: tuple[str, str] | None = None
        self.last_job: RayJob | None = None

    def default_num_proc(self) -> int:
        if self.workers is not None:
            return self.workers.num_proc
        n = capacity(self.ray, self.resources)
        if n < 1:
            raise ConfigError(f"this Ray cluster cannot hold one rank of {self.resources.per_rank()}")
        return n

    def check_num_proc(self, num_proc: int) -> None:
        if self.workers is not None:
            if num_proc != self.workers.num_proc:
                raise ConfigError(f"num_proc={num_proc}, but the Ray worker group has {self.workers.num_proc} actors")
        elif self.placement_group is None:
            check_capacity(self.ray, num_proc, self.resources)

    def driver_addresses(self) -> tuple[str, str]:
        if self._addresses is None:
            self._addresses = service_addresses(self.ray)
        return self._addresses

    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        loopback = is_loopback(self.driver_addresses()[1])

        def make_group() -> RayWorkerGroup:
            return RayWorkerGroup.create(spec.num_proc, self.resources, start_timeout=spec.start_timeout,
                                         placement_group=self.placement_group)

        job = RayJob(spec, service, make_group=make_group, group=self.workers, loopback=loopback)
        self.last_job = job
        return start_or_cancel(job)


__all__ = ["RayLauncher", "RayJob", "RayWorkerGroup", "RayResources", "RankActor", "require_ray", "STRATEGIES",
           "ENV_PLACEMENT_TIMEOUT", "DEFAULT_PLACEMENT_TIMEOUT"]
