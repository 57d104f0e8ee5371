"""``hora.runners.run``: run a function on N ranks on any backend, collect the results.

A :class:`Backend` knows how to start the ranks of one :class:`~hora.runners.spec.LaunchSpec`
somewhere (local processes, one Spark barrier stage, pinned Dask tasks) and returns a
:class:`Job`. Everything else is shared: the driver service the ranks report to, the
checks for ranks that never start, fail, hang or die, and the teardown.
"""

from __future__ import annotations

import abc
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from hora.errors import ConfigError, RendezvousError, WorkerFailedError
from hora.native.rendezvous import DEFAULT_START_TIMEOUT, ENV_BACKEND, ENV_START_TIMEOUT, env_float, make_secret
from hora.runners.driver import DriverService
from hora.runners.spec import (
    DEFAULT_FINISH_TIMEOUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    ENV_FINISH_TIMEOUT,
    ENV_HEARTBEAT_TIMEOUT,
    FailureReport,
    LaunchSpec,
    check_run_id,
    dumps,
    env_seconds,
    new_run_id,
)

log = logging.getLogger(__name__)

FAILURE_REPORT_GRACE = 2.0  # seconds to wait for a rank's own failure report after its process died


class RunTimeoutError(WorkerFailedError, TimeoutError):
    """Ranks did not finish in time (``timeout`` of :func:`run`, or ``HORA_FINISH_TIMEOUT``
    after another rank had already returned)."""


class Job(abc.ABC):
    """The ranks of one run, started by a :class:`Backend`."""

    @abc.abstractmethod
    def poll(self) -> list[Any] | None:
        """The per-rank results in rank order once every rank returned, else None.

        Raises:
            WorkerFailedError: the engine reports a failed rank, task or worker.
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop every rank and wait until their processes are gone (idempotent)."""

    def host_of(self, rank: int) -> str | None:
        """The host a rank runs on, if known."""
        return None


class Backend(abc.ABC):
    """Where ranks run. Subclasses: :class:`~hora.runners.local.LocalBackend`,
    :class:`~hora.runners.spark.SparkBackend`, :class:`~hora.runners.dask.DaskBackend`."""

    name = "backend"

    @abc.abstractmethod
    def default_num_proc(self) -> int:
        """The number of ranks when ``num_proc`` is not given."""

    def check_num_proc(self, num_proc: int) -> None:
        """Fail at once when the backend cannot run ``num_proc`` ranks together.

        Raises:
            ConfigError: not enough free slots (the message says how many there are).
        """

    def driver_addresses(self) -> tuple[str, str]:
        """``(bind, advertise)``: where the driver service listens and how ranks reach it."""
        adv = os.environ.get("HORA_ADVERTISE_ADDR") or "127.0.0.1"
        return ("127.0.0.1" if adv.startswith("127.") else "0.0.0.0", adv)

    @abc.abstractmethod
    def start(self, spec: LaunchSpec, service: DriverService) -> Job:
        """Start ``spec.num_proc`` ranks; return at once with the running :class:`Job`."""


def resolve_backend(backend: str | Backend, *, spark: Any = None, client: Any = None) -> Backend:
    """Turn ``"local"``, ``"spark"``, ``"dask"`` or a :class:`Backend` into a Backend.

    Raises:
        ConfigError: an unknown backend name.
    """
    if isinstance(backend, Backend):
        return backend
    if backend == "local":
        from hora.runners.local import LocalBackend

        return LocalBackend()
    if backend == "spark":
        from hora.runners.spark import SparkBackend

        return SparkBackend(spark)
    if backend == "dask":
        from hora.runners.dask import DaskBackend

        return DaskBackend(client)
    raise ConfigError(f"backend {backend!r} is unknown; use 'local', 'spark', 'dask' or a hora.runners.Backend")


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
    backend: str | Backend = "local",
    env: Mapping[str, str] | None = None,
    start_timeout: float | None = None,
    run_id: str | None = None,
    store: Any = None,
    verbose: int = 1,
    spark: Any = None,
    client: Any = None,
    timeout: float | None = None,
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
        backend: ``"local"``, ``"spark"``, ``"dask"`` or a :class:`Backend` instance.
        env: extra environment variables for every rank (``HORA_BACKEND`` picks the
            collective backend; ``HORA_TIMELINE``, ``HORA_CYCLE_TIME``, ... tune the engine).
        start_timeout: seconds every rank has to start (default ``HORA_START_TIMEOUT`` or 60).
        run_id: names the run (default: a fresh timestamped id).
        store: a :class:`hora.store.Store` or URL; run logs go there.
        verbose: 0 silent, 1 rank output and progress bar, 2 also debug logs in the ranks.
        spark: the SparkSession for ``backend="spark"`` (default: the active one).
        client: the ``distributed.Client`` for ``backend="dask"`` (default: the active one).
        timeout: optional limit in seconds for the whole run.

    Raises:
        ConfigError: bad arguments, or more ranks than the backend's free slots.
        WorkerFailedError: a rank raised or died (``rank``, ``host``, ``remote_traceback``).
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
    be = resolve_backend(backend, spark=spark, client=client)
    if num_proc is None:
        num_proc = be.default_num_proc()
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"num_proc must be an int >= 1, got {num_proc!r}")
    be.check_num_proc(num_proc)
    if start_timeout is None:
        start_timeout = env_float(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT)
    elif not (isinstance(start_timeout, (int, float)) and start_timeout > 0):
        raise ConfigError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    env = dict(env or {})
    collective = (env.get(ENV_BACKEND) or os.environ.get(ENV_BACKEND) or "auto").lower()
    try:
        payload = dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as exc:
        raise ConfigError(f"fn {getattr(fn, '__qualname__', fn)!r} or its arguments cannot be pickled: {exc}") from exc
    store = _open_store(store)
    secret = make_secret()
    bind, advertise = be.driver_addresses()
    service = DriverService(secret, num_proc, run_id, bind=bind, advertise=advertise, verbose=verbose, store=store)
    job: Job | None = None
    try:
        spec = LaunchSpec(
            payload=payload,
            fn_name=getattr(fn, "__qualname__", repr(fn)),
            num_proc=num_proc,
            run_id=run_id,
            secret=secret,
            driver_addr=service.addr,
            env=tuple(env.items()),
            start_timeout=float(start_timeout),
            collective_backend=collective,
            verbose=verbose,
            sys_path=tuple(p for p in sys.path if isinstance(p, str)),
        )
        log.info("hora run %s: %d rank(s) of %s on %s", run_id, num_proc, spec.fn_name, be.name)
        job = be.start(spec, service)
        return _monitor(spec, service, job, timeout)
    except KeyboardInterrupt:
        log.warning("hora run %s interrupted; stopping every rank", run_id)
        raise
    finally:
        service.abort()
        if job is not None:
            job.cancel()
        service.close()


def _failure_error(report: FailureReport) -> WorkerFailedError:
    return WorkerFailedError(
        f"rank {report.rank} on {report.host} failed: {report.error}",
        rank=report.rank,
        host=report.host,
        remote_traceback=report.traceback or None,
        exitcode=report.exitcode,
    )


def _monitor(spec: LaunchSpec, service: DriverService, job: Job, timeout: float | None) -> list[Any]:
    n = spec.num_proc
    hb_timeout = env_seconds(ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT)
    finish_timeout = env_seconds(ENV_FINISH_TIMEOUT, DEFAULT_FINISH_TIMEOUT)
    t0 = time.monotonic()
    first_done_at: float | None = None
    while True:
        failures = service.failures()
        if failures:
            raise _failure_error(failures[0])
        try:
            results = job.poll()
        except WorkerFailedError as exc:
            deadline = time.monotonic() + FAILURE_REPORT_GRACE
            while time.monotonic() < deadline:
                failures = service.failures()
                if failures:
                    raise _failure_error(failures[0]) from None
                time.sleep(0.1)
            raise exc
        if results is not None:
            if len(results) != n:
                raise WorkerFailedError(f"expected {n} results, got {len(results)}")
            return results
        now = time.monotonic()
        started = service.started()
        if len(started) < n and now - t0 > spec.start_timeout:
            missing = sorted(set(range(n)) - set(started))
            raise RendezvousError(
                f"rank(s) {missing} of run {spec.run_id} never started within {spec.start_timeout:g}s "
                f"({len(started)} of {n} started; raise start_timeout or {ENV_START_TIMEOUT} if the cluster is slow)"
            )
        done = service.done()
        if done and first_done_at is None:
            first_done_at = now
        if first_done_at is not None and len(done) < n and now - first_done_at > finish_timeout:
            missing = sorted(set(range(n)) - done)
            raise RunTimeoutError(
                f"rank(s) {missing} did not finish within {finish_timeout:g}s after rank(s) {sorted(done)} "
                f"returned (hanging? raise {ENV_FINISH_TIMEOUT} if this is expected)",
                rank=missing[0],
                host=started.get(missing[0]),
            )
        stale = service.stale_heartbeats(hb_timeout, ignore=done)
        if stale:
            raise WorkerFailedError(
                f"rank(s) {stale} stopped sending heartbeats for {hb_timeout:g}s: their process or machine died",
                rank=stale[0],
                host=started.get(stale[0]),
            )
        if timeout is not None and now - t0 > timeout:
            missing = sorted(set(range(n)) - done)
            raise RunTimeoutError(
                f"run {spec.run_id} did not finish within timeout={timeout:g}s; rank(s) {missing} still running",
                rank=missing[0] if missing else None,
                host=started.get(missing[0]) if missing else None,
            )
        time.sleep(0.1)


__all__ = ["run", "Backend", "Job", "RunTimeoutError", "resolve_backend"]
