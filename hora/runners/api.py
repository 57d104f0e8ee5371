"""Run a function on N ranks: :func:`run` (``hora.runners.run``, any launcher) and
:func:`horovod_run` (``hora.run``, Horovod's ``horovod.run`` signature).

:func:`run` builds the frozen :class:`~hora.runners.spec.LaunchSpec` and drives the
attempts of a run: each attempt is a fresh driver service and secret, the launcher's
ranks, the one monitor (:func:`hora.runners.driver.monitor.watch`) and the teardown; a
lost rank or host relaunches them up to ``max_failures`` times.

``hora.run``: Horovod's ``horovod.run`` (``horovod.runner.run``), same signature.


>>> import hora
>>> def train(lr):
...     import hora.torch as hvd
...     hvd.init()
...     return hvd.rank()
>>> hora.run(train, args=(0.1,), num_proc=2)                      # [0, 1]
>>> hora.run(train, args=(0.1,), num_proc=4, hosts="a:2,b:2")      # over ssh

As in Horovod, ``func`` calls ``hvd.init()`` itself; its return values come back in
rank order. hora's own launcher (Gloo) is the default; ``use_mpi=True`` goes through
mpiexec. Elastic mode (``min_num_proc``, ``host_discovery_script``, ...) is not in
``hora.run``: those arguments raise :class:`~hora.errors.ConfigError` naming them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from hora import settings
from hora.errors import ConfigError, RunTimeoutError
from hora.native.rendezvous import ENV_BACKEND, ENV_START_TIMEOUT, make_secret
from hora.runners.driver.attempts import Launch, run_attempts
from hora.runners.driver.monitor import Policy
from hora.runners.driver.recovery import Attempts, check_max_failures, start_size, wait_for_slots
from hora.runners.driver.service import DriverService
from hora.runners.launcher import Job, Launcher, resolve_launcher
from hora.runners.launchers.backend import BackendLauncher
from hora.runners.spec import LaunchSpec, check_run_id, dumps, new_run_id

log = logging.getLogger(__name__)


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
    tls: bool | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks and return their values in rank order.

    Inside ``fn``, ``hora.native`` is initialised (``HORA_*`` variables set, ``init()``
    called) and :func:`hora.runners.report` feeds the driver's progress bar. Each rank's
    output reaches the driver prefixed by its rank and, with a ``store``, is saved to
    ``<store>/runs/<run_id>/logs/rank.<r>.log``.

    Args:
        fn: a picklable (cloudpickle) function.
        args, kwargs: its arguments (pickled once, shipped to every rank).
        num_proc: ranks; default: the launcher's slots (CPU count, Spark default
            parallelism, Dask workers).
        backend: the launcher: ``"local"``, ``"spark"``, ``"dask"`` or a :class:`Launcher`
            (e.g. :class:`~hora.runners.launchers.hosts.HostsLauncher` for ssh hosts; a
            :class:`~hora.runners.launchers.backend.BackendLauncher` hands ``fn`` to the
            Horovod-style Backend it wraps, whose ``run()`` starts the ranks). To turn any
            accepted ``backend=`` shape into a launcher and these keywords, see :func:`hora.runners.resolve`.
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
            :mod:`hora.runners.driver.faults`). An exception raised by ``fn`` is not retried. Each
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
        tls: the driver service and rendezvous in TLS with a per-attempt certificate the ranks
            pin (:mod:`hora.native.rendezvous.tls`; needs ``hora[tls]``); None: ``HORA_TLS``.

    Raises:
        ConfigError: bad arguments (``max_failures < 0``, ...), or more ranks than the
            launcher's free slots.
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
    if isinstance(launcher, BackendLauncher):  # Horovod's Backend interface: it runs fn on its ranks itself
        return _run_on_backend(launcher, fn, args, kwargs, env, num_proc, max_failures, min_num_proc)
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
        start_timeout = settings.get(ENV_START_TIMEOUT)
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
    printing = {"store": store, "stdout": stdout, "stderr": stderr, "timestamps": timestamps, "tls": tls}
    attempts = Attempts(run_id, max_failures, launcher.name)

    def start_attempt(size: int, left: float | None) -> Launch:
        return _start_attempt(launcher, dataclasses.replace(spec, num_proc=size), attempts, printing, left, timeout)

    def next_size(_size: int) -> int:
        return wait_for_slots(launcher, min_num_proc or most, most, float(start_timeout), run_id)

    return run_attempts(start_attempt, attempts, spec.num_proc, timeout=timeout, next_size=next_size)


def _run_on_backend(launcher: BackendLauncher, fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any] | None,
                    env: Mapping[str, str] | None, num_proc: int | None, max_failures: int,
                    min_num_proc: int | None) -> list[Any]:
    """``fn`` through a Horovod-style Backend's ``run()`` (its results in rank order).

    Raises:
        ConfigError: ``max_failures`` or ``min_num_proc`` (the backend relaunches nothing), or a
            ``num_proc`` other than the backend's ``num_processes()``.
    """
    if max_failures or min_num_proc is not None:
        raise ConfigError(f"max_failures / min_num_proc need a hora launcher: the run() of backend "
                          f"{launcher.backend!r} cannot relaunch lost ranks")
    if num_proc is not None and num_proc != launcher.default_num_proc():
        raise ConfigError(f"num_proc={num_proc}, but backend {launcher.backend!r} runs "
                          f"{launcher.default_num_proc()} process(es): pass num_proc to the backend")
    return launcher.run(fn, args, kwargs, env)


def _start_attempt(launcher: Launcher, spec: LaunchSpec, attempts: Attempts, printing: dict[str, Any],
                   timeout: float | None, given_timeout: float | None = None) -> Launch:
    """One launch of a run: a fresh driver service and secret, the ranks; its teardown stops them
    (``timeout``: what is left of the run's ``given_timeout`` for this attempt)."""
    bind, advertise = launcher.driver_addresses()
    secret = make_secret() if attempts.number > 1 else spec.secret
    service = DriverService(secret, spec.num_proc, spec.run_id, bind=bind, advertise=advertise,
                            verbose=spec.verbose, attempt=attempts.number, label=attempts.label(), **printing)
    job: Job | None = None

    def close() -> None:
        service.abort()
        try:
            if job is not None:
                job.cancel()
        finally:
            service.close()

    try:
        spec = dataclasses.replace(spec, secret=secret, driver_addr=service.addr, attempt=attempts.number,
                                   tls=service.tls)
        log.info("hora run %s: %d rank(s) of %s on %s%s", spec.run_id, spec.num_proc, spec.fn_name, launcher.name,
                 f" ({attempts.label()})" if attempts.label() else "")
        job = launcher.start(spec, service)
    except BaseException:
        close()
        raise
    return Launch(service, job, Policy(num_proc=spec.num_proc, run_id=spec.run_id, start_timeout=spec.start_timeout,
                                       functions=True, timeout=timeout, given_timeout=given_timeout), close)


def horovod_run(
    func: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int = 1,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[int, int] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    host_discovery_script: str | None = None,
    start_timeout: float | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: int | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    network_interfaces: Iterable[str] | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    max_failures: int = 0,
) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks and return their values in rank order.

    Args (Horovod's):
        func: a picklable function; it calls ``hvd.init()`` itself.
        args, kwargs: its arguments.
        num_proc: the number of ranks (``np`` is its deprecated spelling).
        hosts: ``"host1:2,host2:2"`` (default ``localhost:num_proc``); hosts other than
            this machine are reached over ssh.
        hostfile: a file of ``host slots=N`` lines instead of ``hosts``.
        start_timeout: seconds for hosts to answer and ranks to start (default
            ``HORA_START_TIMEOUT`` or 60).
        ssh_port, ssh_identity_file: ssh's ``-p`` and ``-i``.
        disable_cache: accepted; hora checks hosts on every run (it keeps no cache).
        output_filename: also write each rank's output to ``<dir>/rank.<r>/stdout|stderr``.
        verbose: 0 quiet, 1 (default) rank output, 2 also debug logs in the ranks.
        use_gloo, use_mpi: the launcher and controller: hora's own with Gloo (default) or mpiexec.
        mpi_args: more mpiexec arguments (with ``use_mpi``).
        network_interfaces: the interface every host communicates on (the first one is
            used; ``network_interface`` is the deprecated comma-separated spelling).
        executable: the Python of the ranks (default this interpreter's path, on every host).
        min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
        host_discovery_script, min_np, max_np: elastic mode, not in ``hora.run``.

    Args (hora's):
        max_failures: relaunch every rank up to this many times when a rank is killed or a
            host is lost (not when ``func`` raises); ``func`` sees ``HORA_ATTEMPT`` (1, 2, ...)
            and resumes from its own checkpoint. See :func:`hora.runners.run`.

    Raises:
        ConfigError: conflicting or unsupported arguments (named), bad hosts.
        WorkerFailedError: a rank failed (rank, host, exit code, remote traceback).
        RendezvousError: a rank never started within ``start_timeout``.
    """
    from hora.runners.slots import resolve_hosts
    from hora.runners.rank.ssh import SshOptions

    if np is not None:
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=2)
        num_proc = np
    if network_interface:
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=2)
        network_interfaces = network_interface.split(",")
    given = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc, "slots": slots, "reset_limit": reset_limit,
             "cooldown_range": cooldown_range, "host_discovery_script": host_discovery_script, "min_np": min_np,
             "max_np": max_np}
    elastic = [k for k, v in given.items() if v is not None]
    if elastic:
        raise ConfigError(f"hora.run: {', '.join(elastic)} (Horovod's elastic mode) is not supported; elastic "
                          "training is `hora run --min-np M --max-np N --host-discovery-script S`; here, run with a "
                          "fixed num_proc and max_failures=N to relaunch every rank after a lost one")
    if hosts is not None and hostfile is not None:
        raise ConfigError("hora.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ConfigError("hora.run: use_gloo and use_mpi cannot both be True")
    if use_mpi and max_failures:
        raise ConfigError("hora.run: max_failures needs hora's own launcher: under use_mpi, mpiexec does not say "
                          "which rank died or how")
    if mpi_args and not use_mpi:
        raise ConfigError("hora.run: mpi_args needs use_mpi=True")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"hora.run: num_proc must be an int >= 1, got {num_proc!r}")
    nics = list(network_interfaces or [])
    host_list = resolve_hosts(hosts, hostfile, num_proc)
    ssh = SshOptions.from_environ(port=ssh_port, identity_file=ssh_identity_file)
    if use_mpi:
        from hora.runners.launchers.mpi import MpiLauncher

        launcher: Launcher = MpiLauncher(host_list, ssh=ssh, python=executable,
                                              extra_args=shlex.split(mpi_args or ""),
                                              interface=nics[0] if nics else None, output_dir=output_filename)
    else:
        from hora.runners.launchers.hosts import HostsLauncher

        launcher = HostsLauncher(host_list, ssh=ssh, python=executable,
                                 network_interface=nics[0] if nics else None, output_dir=output_filename)
    level = 1 if verbose is None else max(0, min(2, int(verbose)))
    return run(func, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=num_proc, backend=launcher,
                    start_timeout=start_timeout, verbose=level, init_native=False, max_failures=max_failures,
                    env={ENV_BACKEND: "mpi"} if use_mpi else None)


__all__ = ["run", "horovod_run", "RunTimeoutError"]
