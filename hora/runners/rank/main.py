"""The one worker entry point: ``python -m hora.runners.rank.main RESULT_PATH``.

Every launcher ends here. The process reads ``pickle.dumps((LaunchSpec, RankContext))``
from its stdin (so the job secret is never on a command line or in a visible string),
sets the ``HORA_*`` environment of the rendezvous contract, reports to the driver
service, calls ``hora.native.init()``, runs ``fn(*args, **kwargs)``, calls
``hora.native.shutdown()`` and writes ``(True, value)`` to ``RESULT_PATH``. When ``fn``
raises, it posts a :class:`~hora.runners.spec.FailureReport` with the traceback to the
driver first, then exits with code 1.

On Spark executors and Dask workers, :func:`hora.runners.rank.supervise.supervise` runs
inside the engine's task and starts this entry point as a subprocess.

Inside ``fn``, :func:`report` sends metrics to the driver's progress bar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from typing import Any

from hora import settings
from hora.errors import HoraError, RendezvousError, WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import ENV_BACKEND, ENV_SECRET, KVClient, WorkerEnv
from hora.native.rendezvous.tls import ENV_TLS_CERT
from hora import pids
from hora.pids import pid_alive
from hora.runners.spec import (
    ENV_ATTEMPT,
    ENV_DRIVER_ADDR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_NETWORK_INTERFACE,
    ENV_RUN_ID,
    ENV_SUPERVISOR_PID,
    HEARTBEAT_INTERVAL,
    FailureReport,
    LaunchSpec,
    RankContext,
)

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_ABORTED = 143
TO_DRIVER = "--to-driver"  # post the result to the driver service instead of a file
FROM_DRIVER = "--from-driver"  # also fetch the spec from the driver (ranks started by mpiexec)
RESULT_CHUNK = 64 * 1024 * 1024  # bytes per key of a result posted to the driver
#: wall-clock times (``time.time()``) of this rank's start-up, read by ``fn`` (the estimators report them):
#: ``payload_loaded`` (spec read, ``fn`` unpickled: imports done), ``native_init`` (rendezvous done)
PHASES: dict[str, float] = {}
#: seconds between two checks that a rank's supervisor lives (a rank whose supervisor died exits
#: within this). Its heartbeats go every ``LaunchSpec.beat_interval`` (1 s; Spark asks for 0.25 s:
#: a Spark rank whose supervisor Spark lost counts as stopped after 4 beats of silence, ``SILENT_AFTER``
#: in :mod:`hora.runners.launchers.spark`); the driver's abort is pushed (:mod:`hora.runners.rank.beats`).
SUPERVISOR_CHECK = 0.25

# ------------------------------------------------------------------------------------------
# report(): metrics to the driver's progress bar
# ------------------------------------------------------------------------------------------
_reporter_lock = threading.Lock()
_reporter: tuple[KVClient, int] | None = None
_metric_seq = itertools.count(1)
_beater: Any = None  # this rank's heartbeat (hora.runners.rank.beats.Beater): metrics ride on it


def _set_reporter(client: KVClient | None, rank: int, beater: Any = None) -> None:
    global _reporter, _beater
    with _reporter_lock:
        _reporter = (client, rank) if client is not None else None
        _beater = beater if client is not None else None


def report(**metrics: Any) -> None:
    """Send live metrics (``step=``, ``total=``, ``epoch=``, ``loss=``, ...) to the driver.

    The driver shows the lowest reporting rank's metrics as a progress bar. Values must
    be picklable (numbers and strings are best). Outside a hora run (no driver), the
    metrics are logged at INFO level instead.

    Raises:
        TypeError: a value cannot be pickled.
    """
    global _reporter
    with _reporter_lock:
        reporter = _reporter
        if reporter is None and os.environ.get(ENV_DRIVER_ADDR) and os.environ.get(ENV_SECRET):
            try:  # under `hora run`: the launcher's service is the driver
                env = WorkerEnv.from_environ()
                reporter = _reporter = (KVClient(os.environ[ENV_DRIVER_ADDR], env.secret), env.rank)
            except HoraError as exc:
                log.debug("report(): no driver reachable: %s", exc)
    if reporter is None:
        log.info("metrics: %s", metrics)
        return
    client, rank = reporter
    try:
        payload = pickle.dumps((next(_metric_seq), metrics))
    except Exception as exc:
        raise TypeError(f"report(): metrics must be picklable: {exc}") from exc
    beater = _beater
    if beater is not None and beater.rank == rank:
        beater.metrics(payload)  # with the next heartbeat: no request of its own
        return
    try:
        client.set(keys.rank_key(keys.METRICS, rank), payload)
    except RendezvousError as exc:
        log.warning("report(): could not reach the driver: %s", exc)


# ------------------------------------------------------------------------------------------
# the worker process
# ------------------------------------------------------------------------------------------
def _configure_logging(verbose: int) -> None:
    # verbose=1: the driver's console tells the run; ranks say only warnings and errors.
    # verbose=2: the ranks' INFO detail; verbose>=3: DEBUG
    level = logging.WARNING if verbose <= 1 else logging.INFO if verbose == 2 else logging.DEBUG
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)


def supervisor_alive(pid: int) -> bool:
    """Whether the supervisor ``pid`` of this rank still runs: its parent (a plain
    subprocess), or a live process (a rank forked by a warm server, :mod:`hora.runners.rank.warm.client`)."""
    return os.getppid() == pid or pid_alive(pid)


class _Watchdog(threading.Thread):
    """Heartbeats to the driver (with the metrics of :func:`report`); exits the process on
    abort (pushed by the driver, :class:`~hora.runners.rank.beats.AbortWatch`), on parent death,
    on a driver that closed its connections (killed) and on a driver silent for
    ``HORA_HEARTBEAT_TIMEOUT``."""

    def __init__(self, client: KVClient, rank: int, parent_pid: int | None,
                 beat_interval: float = HEARTBEAT_INTERVAL, relay: Any = None) -> None:
        from hora.runners.rank.beats import AbortWatch, Beater

        super().__init__(name="hora-watchdog", daemon=True)
        self.rank = rank
        self.parent_pid = parent_pid
        self.beat_interval = beat_interval
        self.lost_after = float(settings.get(ENV_HEARTBEAT_TIMEOUT))
        # Its own connection with a short timeout: a heartbeat to a dead driver gives up in seconds
        # (the shared client's connect retries for HORA_RENDEZVOUS_TIMEOUT, 60 s, and its lock may be
        # held by the training thread's call to the same dead driver).
        self.client = client.with_timeout(max(1.0, min(5.0, self.lost_after / 3)))
        self.beater = Beater(self.client, rank, relay)  # relay: the host's beats in one frame
        self.abort_watch = AbortWatch(client, self._aborted, self._lost, name=f"rank{rank}",
                                      period=min(10.0, max(1.0, self.lost_after / 3)), lost_after=self.lost_after)
        self.stopped = threading.Event()

    def _aborted(self) -> None:
        log.warning("rank %d: the driver aborted the run; exiting", self.rank)
        os._exit(EXIT_ABORTED)

    def _lost(self, reason: str) -> None:
        log.error("rank %d: lost the driver (%s); exiting", self.rank, reason)
        os._exit(EXIT_ABORTED)

    def run(self) -> None:
        self.abort_watch.start()
        try:
            self._beat()
        finally:  # the watchdog stopped: so does its watch (a driver closed after this is no news)
            self.abort_watch.stop()
            self.beater.flush()  # the metrics reported since the last beat (and the relayed beats)
            self.beater.close()

    def _beat(self) -> None:
        last_ok = time.monotonic()
        next_beat = 0.0
        while not self.stopped.wait(min(SUPERVISOR_CHECK, self.beat_interval)):
            if self.parent_pid is not None and not supervisor_alive(self.parent_pid):
                log.error("rank %d: its supervisor (pid %d) is gone; exiting", self.rank, self.parent_pid)
                os._exit(EXIT_ABORTED)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + self.beat_interval
            try:
                self.beater.beat()
                last_ok = time.monotonic()
            except HoraError:
                if time.monotonic() - last_ok > self.lost_after:
                    log.error("rank %d: lost the driver for %.0fs; exiting", self.rank, self.lost_after)
                    os._exit(EXIT_ABORTED)


def _host_beats(spec: LaunchSpec) -> Any:
    """This rank's side of its host's heartbeat relay (:mod:`hora.runners.rank.relay`), or None."""
    from hora.runners.rank.relay import for_rank

    try:
        return for_rank(spec.secret, spec.run_id, spec.attempt, spec.driver_addr, spec.beat_interval)
    except OSError as exc:  # no unix socket here: every beat goes to the driver itself
        log.debug("rank heartbeats not batched per host: %s", exc)
        return None


def _native_module() -> Any:
    """``hora.native`` with its op layer loaded.

    Raises:
        ImportError: naming torch, which the collective engine's backends are built on.
    """
    import hora.native as hn

    try:
        hn.init  # noqa: B018 - hora.native is lazy: this loads the op layer (and torch)
    except ImportError as exc:
        raise ImportError(f"hora.runners initialises hora.native in every rank, which needs torch: {exc}") from exc
    return hn


def error_types(exc: BaseException) -> tuple[str, ...]:
    """The qualified names of the classes of ``exc`` (``builtins.ConnectionResetError``,
    ``builtins.ConnectionError``, ...): what the driver classifies a failure by."""
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__)


def _post_failure(client: KVClient | None, rank: int, host: str, exc: BaseException, tb: str, code: int | None,
                  died: bool = False) -> None:
    if client is None:
        return
    try:
        seq = client.add(keys.FAILSEQ, 1)
        report_ = FailureReport(seq=seq, rank=rank, host=host, error=f"{type(exc).__name__}: {exc}", traceback=tb,
                                exitcode=code, error_types=() if died else error_types(exc), died=died)
        client.set(keys.rank_key(keys.FAILED, rank), pickle.dumps(report_))
    except Exception as post_exc:  # the exit code still tells the launcher
        log.warning("rank %d could not post its failure to the driver: %s", rank, post_exc)


def rank_environ(spec: LaunchSpec, ctx: RankContext | None) -> dict[str, str]:
    """The environment variables one rank runs with (spec env, contract, settings).

    Without a ``ctx`` (ranks started by mpiexec) the rank learns its place from MPI and
    only the spec's variables and the driver's address are set.
    """
    env = dict(spec.env)
    env[ENV_DRIVER_ADDR] = spec.driver_addr
    env[ENV_RUN_ID] = spec.run_id
    env[ENV_ATTEMPT] = str(spec.attempt)
    if spec.tls is not None:  # the certificate the rank's connections pin (never its key)
        env[ENV_TLS_CERT] = spec.tls.to_text()
    if ctx is None:
        env[ENV_BACKEND] = spec.collective_backend
        return env
    env.update(dict(ctx.extra_env))
    hostname = ctx.hostname
    iface = settings.get(ENV_NETWORK_INTERFACE, env)
    if iface:  # advertise the chosen interface's address of this host (hora.spark.run(nics=...))
        from hora.runners.network import interface_address

        hostname = interface_address(iface)
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = iface
    env.update(
        WorkerEnv(
            placement=dataclasses.replace(ctx.placement, host=hostname),
            rendezvous_addr=ctx.rendezvous_addr,
            secret=spec.secret,
            job_id=spec.run_id,
            backend=spec.collective_backend,
            start_timeout=spec.start_timeout,
        ).to_environ()
    )
    if hostname.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _mpi_rank() -> int:
    from hora.native.backends import MPI_LAUNCH_VARS

    for name in MPI_LAUNCH_VARS:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise WorkerFailedError(f"--from-driver needs a rank from mpiexec ({', '.join(MPI_LAUNCH_VARS)} unset)")


def post_result(client: KVClient, rank: int, value: Any) -> None:
    """Send a rank's value to the driver service in chunks (``runner/result/<r>``)."""
    import cloudpickle

    data = cloudpickle.dumps(value)
    chunks = [data[i:i + RESULT_CHUNK] for i in range(0, len(data), RESULT_CHUNK)] or [b""]
    for i, chunk in enumerate(chunks):
        client.set(keys.result_chunk_key(rank, i), chunk)
    client.set(keys.rank_key(keys.RESULT, rank), str(len(chunks)).encode())


def _write_result(result_path: str, value: Any) -> None:
    import cloudpickle

    tmp = result_path + ".tmp"
    with open(tmp, "wb") as fh:
        cloudpickle.dump((True, value), fh)
    os.replace(tmp, result_path)


def run_rank(spec: LaunchSpec, ctx: RankContext | None, result_path: str | None) -> int:
    """Run one rank in this process; return the process exit code (0 on success).

    The value of ``fn`` goes to ``result_path``, or to the driver service when it is None.
    The heartbeat thread stops and the driver connection closes when the rank ends, however
    it ends: a process that lives on (a Ray actor) must not exit at a later abort or when
    the driver of a finished run goes away.
    """
    os.environ.update(rank_environ(spec, ctx))
    _configure_logging(spec.verbose)
    for entry in reversed(spec.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    host = ctx.hostname if ctx is not None else socket.gethostname()
    rank = ctx.rank if ctx is not None else -1
    parent = os.environ.get(ENV_SUPERVISOR_PID)
    client: KVClient | None = None
    watchdog: _Watchdog | None = None
    try:
        rank = ctx.rank if ctx is not None else _mpi_rank()
        client = KVClient(spec.driver_addr, spec.secret)
        client.set(keys.rank_key(keys.STARTED, rank), host.encode())
        PHASES["registered"] = time.time()
        watchdog = _Watchdog(client, rank, int(parent) if parent else None, spec.beat_interval, _host_beats(spec))
        watchdog.start()
        _set_reporter(client, rank, watchdog.beater)
        import cloudpickle

        fn, args, kwargs = cloudpickle.loads(spec.payload)
        PHASES["payload_loaded"] = time.time()
        hn = _native_module() if spec.init_native else None
        if hn is not None:
            hn.init()
        PHASES["native_init"] = time.time()
        value = fn(*args, **kwargs)
        client.set(keys.rank_key(keys.DONE, rank), b"1")  # returned: the driver's finish timeout starts
        if hn is not None:
            if hn.is_initialized():
                # No engine shuts down before every rank's function has returned: a rank
                # still on its way to the function's own hvd.init() (a no-op then, as in
                # Horovod) would otherwise find a peer gone and try to re-form the job.
                hn.barrier()
            hn.shutdown()
        if result_path is None:
            post_result(client, rank, value)
        else:
            _write_result(result_path, value)
        return 0
    except BaseException as exc:
        tb = traceback.format_exc()
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code else EXIT_FAILED
        sys.stderr.write(tb)
        sys.stderr.flush()
        _post_failure(client, rank, host, exc, tb, code)
        return code
    finally:
        _set_reporter(None, rank)
        _stop(watchdog, client)


def _stop(watchdog: _Watchdog | None, client: KVClient | None) -> None:
    """Stop the heartbeat thread (waiting out a heartbeat in flight), then close the client."""
    if watchdog is not None:
        watchdog.abort_watch.stop()
        watchdog.stopped.set()
        watchdog.join(timeout=HEARTBEAT_INTERVAL + 10)
        if watchdog.is_alive():  # blocked in a call to the driver: leave it the client
            log.warning("rank %d: the heartbeat thread did not stop within %.0fs", watchdog.rank,
                        HEARTBEAT_INTERVAL + 10)
            return
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()


def _spec_from_driver() -> tuple[LaunchSpec, None]:
    """The spec a rank started by mpiexec fetches from the driver (address and secret in its environment)."""
    env = os.environ
    missing = [n for n in (ENV_DRIVER_ADDR, ENV_SECRET) if not env.get(n)]
    if missing:
        raise WorkerFailedError(f"--from-driver needs {', '.join(missing)} in the environment")
    client = KVClient(env[ENV_DRIVER_ADDR], bytes.fromhex(env[ENV_SECRET]))
    try:
        spec = pickle.loads(client.get(keys.SPEC))
    finally:
        client.close()
    return spec, None


USAGE = (f"usage: python -m hora.runners.rank.main RESULT_PATH | {TO_DRIVER} | {FROM_DRIVER}\n"
         "  (the pickled (LaunchSpec, RankContext) on stdin, except with --from-driver)\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hora.runners.rank.main RESULT_PATH | --to-driver | --from-driver``."""
    argv = sys.argv[1:] if argv is None else argv
    PHASES["main"] = time.time()
    pids.die_with_parent()
    parent = os.environ.get(ENV_SUPERVISOR_PID)
    if parent and not supervisor_alive(int(parent)):
        return EXIT_ABORTED  # the parent died before PR_SET_PDEATHSIG took effect
    if len(argv) != 1:
        sys.stderr.write(USAGE)
        return 2
    try:
        if argv[0] == FROM_DRIVER:
            spec, ctx = _spec_from_driver()
        else:
            spec, ctx = pickle.loads(sys.stdin.buffer.read())
    except Exception as exc:
        sys.stderr.write(f"hora worker: cannot read the launch spec: {exc}\n")
        return 2
    PHASES["spec_read"] = time.time()
    # the caller (``__main__``) ends the process with hora.pids.exit_process: the result is
    # out, and the interpreter's finalization would only delay the supervisor by 0.3-0.5 s
    return run_rank(spec, ctx, None if argv[0] in (TO_DRIVER, FROM_DRIVER) else argv[0])


__all__ = ["report", "main", "run_rank", "rank_environ"]


if __name__ == "__main__":
    # run the imported module, not this __main__ copy, so report() sees the same globals
    from hora.pids import exit_process
    from hora.runners.rank.main import main as _main

    exit_process(_main())
