"""``hora.ray.RayExecutor``: Horovod's ``horovod.ray.RayExecutor`` on hora's Ray launcher.

>>> from hora.ray import RayExecutor
>>> settings = RayExecutor.create_settings(timeout_s=30)
>>> executor = RayExecutor(settings, num_workers=4, cpus_per_worker=2, use_gpu=True)
>>> executor.start()
>>> executor.run(train_fn, args=(config,))     # one value per worker, in rank order
>>> executor.shutdown()

The workers are long-lived Ray actors in one placement group
(:class:`hora.runners.launchers.ray.launcher.RayWorkerGroup`). Every call on all workers (``start`` with
an ``executable_cls``, ``run``, ``run_remote``, ``execute``) is one hora run on them:
a fresh rendezvous, ``hora.native`` initialised before the function and shut down
after it (so ``hvd.init()`` inside the function is a no-op and ``hvd.rank()`` works),
output printed on the driver by rank, the first failing worker raised as
:class:`~hora.errors.WorkerFailedError` with its traceback. The executable object
(``executable_cls(*executable_args)``) lives in each actor between calls.

Unlike Horovod, ``hora.native`` is not initialised between calls: state such as
process sets is per call. ``execute_single`` runs outside any hora run (rank 0 alone).
After a call fails, every worker is stopped (the others may be stuck in a collective or
half-way through a step): the error says which worker failed first, and ``start()``
begins again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora.errors import ConfigError, WorkerFailedError
from hora.runners.launchers.ray.placement import DEFAULT_PLACEMENT_TIMEOUT, RayResources, require_ray
from hora.runners.launchers.ray.workers import RayWorkerGroup
from hora.runners.launchers.ray.launcher import RayLauncher
from hora.runners.spec import ENV_NETWORK_INTERFACE

log = logging.getLogger(__name__)

ELASTIC_MESSAGE = ("elastic Ray training (min_workers / max_workers / reset_limit / cooldown_range, "
                   "ElasticRayExecutor) is not supported on Ray: use num_workers for a fixed number of workers, or "
                   "elastic training with `hora run --min-np/--max-np` or an estimator's num_proc=(min, max)")

# --------------------------------------------------------------------------------------
# inside the actors: the executable object of each worker
# --------------------------------------------------------------------------------------
_executable: Any = None


def _construct(cls: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    global _executable
    _executable = cls(*args, **kwargs)


def _with_executable(fn: Callable[[Any], Any]) -> Any:
    return fn(_executable)




@dataclasses.dataclass
class RaySettings:
    """Settings of a :class:`RayExecutor` (Horovod's ``MiniSettings``).

    Attributes:
        timeout_s: seconds for the workers to start and for every rank of a call to
            reach the rendezvous.
        placement_group_timeout_s: seconds for the placement group to be scheduled.
        nics: network interfaces ranks use (hora uses one: a set of at most one name).
        verbose: 0 silent, 1 worker output and progress bar, 2 debug logs in the workers.
        ssh_identity_file: accepted for drop-in; Ray reaches its nodes itself, so hora
            neither reads nor writes it.

    Raises:
        ConfigError: a non-positive timeout, more than one interface.
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT
    nics: frozenset[str] | None = None
    verbose: int = 1
    ssh_identity_file: str | None = None
    elastic: bool = False

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_group_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.nics is not None:
            if isinstance(self.nics, str):
                self.nics = frozenset({self.nics})
            self.nics = frozenset(self.nics)
            if len(self.nics) > 1:
                raise ConfigError(f"nics={sorted(self.nics)}: hora's ranks use one network interface; name one")
        if isinstance(self.verbose, bool) or not isinstance(self.verbose, int):
            raise ConfigError(f"verbose must be an int (0, 1 or 2), got {self.verbose!r}")

    @property
    def start_timeout(self) -> float:
        return float(self.timeout_s)

    def env(self) -> dict[str, str]:
        """Variables every call's ranks get."""
        return {ENV_NETWORK_INTERFACE: next(iter(self.nics))} if self.nics else {}


class RayExecutor:
    """Horovod's RayExecutor: a fixed group of workers (Ray actors) that run functions together.

    Args:
        settings: from :meth:`create_settings` (default: its defaults).
        num_workers: the number of workers (ranks).
        num_hosts, num_workers_per_host: instead of ``num_workers``: that many workers on
            each of ``num_hosts`` distinct nodes (a STRICT_SPREAD placement group).
        cpus_per_worker: CPUs per worker.
        use_gpu: give each worker ``gpus_per_worker`` GPUs (default 1).
        gpus_per_worker: GPUs per worker when ``use_gpu``.
        use_current_placement_group: when this executor is created inside a Ray
            placement group (e.g. a Ray Tune trial), start the workers in it.
        min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout,
            override_discovery: Horovod's elastic mode; not available (NotImplementedError).
        strategy: the placement strategy with ``num_workers`` (default PACK; SPREAD, ...).

    Raises:
        NotImplementedError: an elastic argument. ConfigError: bad sizes or resources.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: float = 100, nics: Any = None) -> RaySettings:
        """Horovod's ``RayExecutor.create_settings`` (``ssh_identity_file`` and ``ssh_str`` are
        accepted and unused: Ray needs no ssh).

        Raises:
            ConfigError: see :class:`RaySettings`.
        """
        if ssh_str:
            log.debug("RayExecutor.create_settings: ssh_str is not used (Ray needs no ssh); no key file is written")
        return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, nics=nics,
                           ssh_identity_file=ssh_identity_file)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1, cpus_per_worker: float = 1,
                 use_gpu: bool = False, gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: Sequence[int] | None = None, elastic_timeout: int = 600,
                 override_discovery: bool = True, *, strategy: str | None = None) -> None:
        if any(v is not None for v in (min_workers, max_workers, reset_limit, cooldown_range)):
            raise NotImplementedError(ELASTIC_MESSAGE)
        self.settings = settings if settings is not None else RaySettings()
        if not isinstance(self.settings, RaySettings):
            raise ConfigError(f"settings must come from RayExecutor.create_settings(), got {type(settings).__name__}")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if num_workers is not None and num_hosts is not None:
            raise ConfigError("give num_workers or num_hosts (with num_workers_per_host), not both")
        if gpus_per_worker is not None and not use_gpu:
            log.warning("gpus_per_worker=%s is ignored without use_gpu=True (as in Horovod)", gpus_per_worker)
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = bool(use_gpu)
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        if num_hosts is not None:
            if strategy is not None and strategy.upper() != "STRICT_SPREAD":
                raise ConfigError(f"num_hosts places workers on distinct nodes (STRICT_SPREAD), not {strategy!r}")
            strategy, per_bundle = "STRICT_SPREAD", num_workers_per_host
        else:
            strategy, per_bundle = strategy or "PACK", 1
        self.resources = RayResources(cpus_per_worker, self.gpus_per_worker, (), strategy, per_bundle,
                                      float(self.settings.placement_group_timeout_s))
        self._group: RayWorkerGroup | None = None
        self._failure: str | None = None
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None

    # -- life cycle ----------------------------------------------------------------------
    def _size(self, current_pg: Any) -> int:
        if self.num_workers is not None:
            return self.num_workers
        if self.num_hosts is not None:
            return self.num_hosts * self.num_workers_per_host
        if current_pg is not None:
            return len(current_pg.bundle_specs)
        raise ConfigError("RayExecutor needs num_workers (or num_hosts with num_workers_per_host)")

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: Mapping[str, Any] | None = None,
              extra_env_vars: Mapping[str, str] | None = None) -> None:
        """Start the workers; with ``executable_cls``, build ``executable_cls(*executable_args,
        **executable_kwargs)`` in every worker (inside a hora run: it may call ``hvd.init()``).

        Raises:
            ConfigError: already started, or the cluster can never hold the workers.
            RendezvousError: the placement group or the actors did not come up in time.
            WorkerFailedError: an actor died, or ``executable_cls`` raised in a worker.
        """
        if self._group is not None:
            raise ConfigError("this RayExecutor is already started; call shutdown() first")
        ray = require_ray()
        from ray.util.placement_group import get_current_placement_group

        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            log.info("RayExecutor: starting the workers in the current placement group")
        self._failure = None
        self._group = RayWorkerGroup.create(self._size(current), self.resources,
                                            start_timeout=self.settings.start_timeout, placement_group=current,
                                            env=dict(extra_env_vars or {}))
        log.debug("RayExecutor started %d worker(s) (ray %s)", self._group.num_proc, ray.__version__)
        if executable_cls is not None:
            try:
                self._run_all(_construct, (executable_cls, list(executable_args or ()),
                                           dict(executable_kwargs or {})))
            except BaseException:
                self.shutdown()
                raise

    def shutdown(self) -> None:
        """Stop every worker and remove the placement group it created (idempotent)."""
        self._join_background()
        if self._group is not None:
            self._group.stop()
            self._group = None

    # -- calls on every worker -------------------------------------------------------------
    def _ready_group(self) -> RayWorkerGroup:
        self._join_background()
        if self._group is None:
            after = f" (its workers were stopped after a call failed: {self._failure})" if self._failure else ""
            raise ConfigError(f"this RayExecutor is not started{after}; call start() first")
        return self._group

    def _launcher(self, group: RayWorkerGroup) -> RayLauncher:
        return RayLauncher(workers=group)

    def _run_all(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                 launcher: RayLauncher | None = None) -> list[Any]:
        from hora.runners.api import run

        group = self._ready_group() if launcher is None else launcher.workers
        assert group is not None
        try:
            return run(fn, args, kwargs, num_proc=group.num_proc, backend=launcher or self._launcher(group),
                       env=self.settings.env(), start_timeout=self.settings.start_timeout,
                       verbose=self.settings.verbose)
        except BaseException as exc:
            self._stop_after_failure(group, exc)
            raise

    def _stop_after_failure(self, group: RayWorkerGroup, exc: BaseException) -> None:
        # the other workers may be stuck in a collective or half-way through a step: stop them all
        if self._group is group:
            self._group = None
        group.stop()
        first = str(exc).strip().splitlines()
        self._failure = f"{type(exc).__name__}: {first[0] if first else ''}"

    @staticmethod
    def _no_callbacks(callbacks: Sequence[Callable] | None) -> None:
        if callbacks:
            raise NotImplementedError("RayExecutor callbacks are not supported: call hora.runners.report(**metrics) "
                                      "in the function; the driver shows them in its progress bar")

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
            callbacks: Sequence[Callable] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; its values in rank order.

        Raises:
            WorkerFailedError: the first failing worker (rank, host, traceback).
            RendezvousError: a worker never reached the call's rendezvous.
            NotImplementedError: ``callbacks``.
        """
        self._no_callbacks(callbacks)
        return self._run_all(fn, tuple(args or ()), dict(kwargs or {}))

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable] | None = None) -> list[Any]:
        """``fn(executable)`` on every worker (``executable`` is None without ``executable_cls``).

        Raises:
            WorkerFailedError, RendezvousError, NotImplementedError: as :meth:`run`.
        """
        self._no_callbacks(callbacks)
        return self._run_all(_with_executable, (fn,))

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """Start ``fn(*args, **kwargs)`` on every worker; return one Ray ``ObjectRef`` per
        worker (``ray.get`` them). The call is watched in the background: the first failure
        stops the others, whose refs then raise too. The next call on this executor waits
        for this one to end.

        Raises:
            ConfigError: not started. RendezvousError: the calls were not submitted in time.
        """
        group = self._ready_group()
        launcher = self._launcher(group)

        def background() -> None:
            try:
                self._run_all(fn, tuple(args or ()), dict(kwargs or {}), launcher=launcher)
            except BaseException as exc:  # the refs raise it to the caller; logged here too
                self._background_error = exc
                log.debug("RayExecutor.run_remote: the call failed: %s", exc)

        self._background_error = None
        self._background = threading.Thread(target=background, name="hora-ray-run-remote", daemon=True)
        self._background.start()
        deadline = time.monotonic() + self.settings.start_timeout + 30
        while time.monotonic() < deadline:
            job = launcher.last_job
            if job is not None and job.started.wait(0.05):
                return list(job.refs)
            if not self._background.is_alive():
                self._background = None
                if self._background_error is not None:
                    raise self._background_error
                break
        raise WorkerFailedError(f"RayExecutor.run_remote: the calls were not submitted within "
                                f"{self.settings.start_timeout + 30:g}s")

    def _join_background(self) -> None:
        thread, self._background = self._background, None
        if thread is not None:
            thread.join()  # bounded: the run's own monitor ends it (start, heartbeat and finish timeouts)

    def execute_single(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Any:
        """``fn(executable)`` on the rank 0 worker alone, outside any hora run (``hora.native``
        is not initialised there); its value.

        Raises:
            WorkerFailedError: the worker's actor died or ``fn`` raised.
            TimeoutError: ``fn`` did not return within ``timeout`` seconds.
        """
        group = self._ready_group()
        ray = group.ray
        ref = group.actors[0].call.remote(functools.partial(_with_executable, fn))
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"execute_single: rank 0 did not return within {timeout:g}s") from None
        except ray.exceptions.RayActorError as exc:
            error = WorkerFailedError(f"rank 0's Ray actor died during execute_single: {exc}", rank=0,
                                      host=group.infos[0].node_ip)
            self._stop_after_failure(group, error)
            raise error from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc
            raise WorkerFailedError(f"execute_single: rank 0 raised {type(cause).__name__}: {cause}", rank=0,
                                    host=group.infos[0].node_ip, remote_traceback=str(exc)) from None

    @property
    def num_workers_running(self) -> int:
        """The number of started workers (0 before start and after shutdown)."""
        return self._group.num_proc if self._group is not None else 0


class ElasticRayExecutor:
    """Horovod's elastic Ray executor: not available in hora yet.

    Raises:
        NotImplementedError: always (elastic training runs under ``hora run`` and the estimators).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(ELASTIC_MESSAGE)

    @classmethod
    def create_settings(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(ELASTIC_MESSAGE)


__all__ = ["RayExecutor", "RaySettings", "ElasticRayExecutor"]
