"""``hora.runners.run``: run a function on N ranks with any launcher, collect the results.

A :class:`Launcher` knows how to start the ranks of one :class:`~hora.runners.spec.LaunchSpec`
somewhere (processes on this machine and on ssh hosts, one Spark barrier stage, pinned
Dask tasks) and returns a :class:`Job`. Everything else is shared: the driver service
the ranks report to, the one monitor (:mod:`hora.runners.monitor`: first failure,
ranks that never start, hang or die) and the teardown.

A launcher is not a collective *backend* (Gloo, NCCL, MPI: :mod:`hora.native.backends`);
``backend=`` of :func:`run` keeps Horovod's spelling for the launcher's name.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from hora import settings
from hora.errors import ConfigError, RendezvousError, WorkerFailedError
from hora.native.rendezvous import DEFAULT_START_TIMEOUT, ENV_BACKEND, ENV_START_TIMEOUT, env_float, make_secret
from hora.runners.driver import DriverService
from hora.runners.monitor import Policy, RunTimeoutError, watch
from hora.runners.recovery import Attempts, check_max_failures, start_size, wait_for_slots
from hora.runners.spec import ENV_ADVERTISE_ADDR, LaunchSpec, check_run_id, dumps, new_run_id

if TYPE_CHECKING:
    from hora.runners.monitor import Failure

log = logging.getLogger(__name__)


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
    """Where ranks run. Subclasses: :class:`~hora.runners.local.LocalLauncher`,
    :class:`~hora.runners.local.HostsLauncher`, :class:`~hora.runners.spark.SparkLauncher`,
    :class:`~hora.runners.dask.DaskLauncher`."""

    name = "launcher"

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


def resolve_launcher(backend: str | Launcher, *, spark: Any = None, client: Any = None) -> Launcher:
    """Turn ``"local"``, ``"spark"``, ``"dask"`` or a :class:`Launcher` into a Launcher.

    Raises:
        ConfigError: an unknown launcher name.
    """
    if isinstance(backend, Launcher):
        return backend
    if backend == "local":
        from hora.runners.local import LocalLauncher

        return LocalLauncher()
    if backend == "spark":
        from hora.runners.spark import SparkLauncher

        return SparkLauncher(spark)
    if backend == "dask":
        from hora.runners.dask import DaskLauncher

        return DaskLauncher(client)
    if backend == "ray":
        from hora.runners.ray import RayLauncher

        return RayLauncher()
    raise ConfigError(f"backend {backend!r} is unknown; use 'local', 'spark', 'dask', 'ray' or a hora.runners.Launcher")


def _open_store(store: Any) -> Any:
    if store is None:
        return None
    if isinstance(store, (str, os.PathLike)):
        from hora.store import Store

        return Store.create(os.fspath(store))
    if not hasattr(store, "layout") or not hasattr(store, "write_bytes"):
        raise ConfigError(f"store must be a hora.store.Store or a store URL, got {type(store).__name__}")
    return store


def run(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    backend: str | Launcher = "local",
    env: Mapping[str, str] | None = None,
    start_timeout: float | None = None,
    run_id: str | None = None,
    store: Any = None,
    verbose: int = 1,
    spark: Any = None,
    client: Any = None,
    timeout: float | None = None,
    *,
    max_failures: int = 0,
    min_num_proc: int | None = None,
    init_native: bool = True,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    timestamps: bool = False,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks and return their values in rank order.

    Inside ``fn``, ``hora.native`` is initialised (``HORA_*`` variables set, ``init()``
    called) and :func:`hora.runners.report` feeds the driver's progress bar. Each rank's
    output reaches the driver prefixed by its rank and, with a ``store``, is saved to
    ``<store>/runs/<run_id>/logs/rank.<r>.log``.

    Args:
        fn: a picklable (cloudpickle) function.
        args, kwargs: its arguments (pickled once, shipped to every rank).
        num_proc: ranks; default: the backend's slots (CPU count, Spark default
            parallelism, Dask workers).
        backend: the launcher: ``"local"``, ``"spark"``, ``"dask"`` or a :class:`Launcher`
            (e.g. :class:`~hora.runners.local.HostsLauncher` for ssh hosts).
        env: extra environment variables for every rank (``HORA_BACKEND`` picks the
            collective backend; ``HORA_TIMELINE``, ``HORA_CYCLE_TIME``, ... tune the engine).
        start_timeout: seconds every rank has to start (default ``HORA_START_TIMEOUT`` or 60).
        run_id: names the run (default: a fresh timestamped id).
        store: a :class:`hora.store.Store` or URL; run logs go there.
        verbose: 0 silent, 1 rank output and progress bar, 2 also debug logs in the ranks.
        spark: the SparkSession for ``backend="spark"`` (default: the active one).
        client: the ``distributed.Client`` for ``backend="dask"`` (default: the active one).
        timeout: optional limit in seconds for the whole run (every attempt together).
        max_failures: relaunch every rank up to this many times when the run fails with a
            retriable fault: a rank killed by a signal, a lost host, executor or Dask worker,
            ranks that never start, a rendezvous/connection error (see
            :mod:`hora.runners.faults`). An exception raised by ``fn`` is not retried. Each
            attempt is a new launch (ranks see ``HORA_ATTEMPT``: 1, 2, ...); before one,
            the launcher waits up to ``start_timeout`` for the slots to be free again.
        min_num_proc: with ``max_failures``, a relaunch may run fewer ranks than
            ``num_proc`` (the most), down to this many: as many as the launcher has slots
            for then (a Spark cluster that lost an executor, a Dask cluster that lost a
            worker; workers that joined are used, up to ``num_proc``). Ranks read the size
            from ``HORA_SIZE`` as always.
        init_native: call ``hora.native.init()`` before ``fn`` (and ``shutdown()`` after);
            False when ``fn`` calls ``hvd.init()`` itself, as under :func:`hora.run`.
        stdout, stderr: where rank output is printed (default: the driver's own).
        timestamps: prefix every printed rank line with the time it arrived.

    Raises:
        ConfigError: bad arguments (``max_failures < 0``, ...), or more ranks than the
            backend's free slots.
        WorkerFailedError: a rank raised or died (``rank``, ``host``, ``remote_traceback``):
            the rank that failed *first*, not a survivor that failed because of it. After
            relaunches, the message names every attempt's cause (``.attempts``).
        RunTimeoutError: the run exceeded ``timeout``, or ranks hung after others returned.
        RendezvousError: a rank never started within ``start_timeout``.
    """
    if not callable(fn):
        raise ConfigError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise ConfigError(f"args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
    if not isinstance(verbose, int):
        raise ConfigError(f"verbose must be an int (0, 1 or 2), got {verbose!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    check_max_failures(max_failures)
    if min_num_proc is not None and (isinstance(min_num_proc, bool) or not isinstance(min_num_proc, int)
                                     or min_num_proc < 1):
        raise ConfigError(f"min_num_proc must be an int >= 1, got {min_num_proc!r}")
    launcher = resolve_launcher(backend, spark=spark, client=client)
    if num_proc is None:
        num_proc = launcher.default_num_proc()
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"num_proc must be an int >= 1, got {num_proc!r}")
    most = num_proc
    if min_num_proc is not None:  # as many ranks as there are slots for, within [min_num_proc, num_proc]
        if min_num_proc > num_proc:
            raise ConfigError(f"min_num_proc={min_num_proc} is greater than num_proc={num_proc}")
        num_proc = start_size(launcher, min_num_proc, num_proc)
    launcher.check_num_proc(num_proc)
    if start_timeout is None:
        start_timeout = env_float(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT)
    elif not (isinstance(start_timeout, (int, float)) and start_timeout > 0):
        raise ConfigError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    env = dict(env or {})
    collective = settings.get(ENV_BACKEND, env if settings.is_set(ENV_BACKEND, env) else None)
    try:
        payload = dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as exc:
        raise ConfigError(f"fn {getattr(fn, '__qualname__', fn)!r} or its arguments cannot be pickled: {exc}") from exc
    store = _open_store(store)
    spec = LaunchSpec(
        payload=payload,
        fn_name=getattr(fn, "__qualname__", repr(fn)),
        num_proc=num_proc,
        run_id=run_id,
        secret=make_secret(),
        driver_addr="127.0.0.1:0",  # each attempt's driver service fills in its own
        env=tuple(env.items()),
        start_timeout=float(start_timeout),
        collective_backend=collective,
        verbose=verbose,
        init_native=bool(init_native),
        sys_path=tuple(p for p in sys.path if isinstance(p, str)),
    )
    printing = {"store": store, "stdout": stdout, "stderr": stderr, "timestamps": timestamps}
    attempts = Attempts(run_id, max_failures, launcher.name)
    t0 = time.monotonic()
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - t0)
        try:
            return _attempt(launcher, spec, attempts, printing, left)
        except (WorkerFailedError, RendezvousError) as exc:
            out_of_time = timeout is not None and time.monotonic() - t0 >= timeout
            attempts.failed(exc, spec.num_proc, out_of_time=out_of_time)
        size = wait_for_slots(launcher, min_num_proc or most, most, float(start_timeout), run_id)
        attempts.relaunching(size)
        spec = dataclasses.replace(spec, num_proc=size)


def _attempt(launcher: Launcher, spec: LaunchSpec, attempts: Attempts, printing: dict[str, Any],
             timeout: float | None) -> list[Any]:
    """One launch of a run: a fresh driver service and secret, the ranks, the monitor, the teardown."""
    bind, advertise = launcher.driver_addresses()
    secret = make_secret() if attempts.number > 1 else spec.secret
    service = DriverService(secret, spec.num_proc, spec.run_id, bind=bind, advertise=advertise,
                            verbose=spec.verbose, attempt=attempts.number, label=attempts.label(), **printing)
    job: Job | None = None
    try:
        spec = dataclasses.replace(spec, secret=secret, driver_addr=service.addr, attempt=attempts.number)
        log.info("hora run %s: %d rank(s) of %s on %s%s", spec.run_id, spec.num_proc, spec.fn_name, launcher.name,
                 f" ({attempts.label()})" if attempts.label() else "")
        job = launcher.start(spec, service)
        return watch(service, job, Policy(num_proc=spec.num_proc, run_id=spec.run_id,
                                          start_timeout=spec.start_timeout, functions=True, timeout=timeout))
    except KeyboardInterrupt:
        log.warning("hora run %s interrupted; stopping every rank", spec.run_id)
        raise
    finally:
        service.abort()
        if job is not None:
            job.cancel()
        service.close()


__all__ = ["run", "Launcher", "Job", "RunTimeoutError", "resolve_launcher"]
