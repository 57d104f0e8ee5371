"""A rank as a subprocess of an engine's task: :func:`supervise` (Spark executors, Dask
workers) and what every launcher needs to start the entry point :mod:`hora.runners.rank.main`.

:func:`supervise` starts the entry point as a subprocess (so a stuck rank can always be
killed and nothing leaks into the engine's own process), streams its output to the driver
and returns its result. The subprocess is forked from a warm server that has imported torch
already (:mod:`hora.runners.rank.warm.client`, ``HORA_WARM_WORKERS``), else started afresh.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from hora import settings
from hora.errors import HoraError, WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import ENV_SECRET, KVClient
from hora.runners.rank.beats import AbortWatch
from hora.runners.rank.main import _post_failure
from hora.runners.spec import (
    ENV_HEARTBEAT_TIMEOUT,
    ENV_SUPERVISOR_PID,
    ENV_TERMINATE_GRACE,
    ENV_WORKER_PYTHON,
    LaunchSpec,
    RankContext,
)

log = logging.getLogger(__name__)


def _driver_call_timeout() -> float:
    """Seconds one call of a supervisor to its driver may take before it counts as unanswered:
    a third of ``HORA_HEARTBEAT_TIMEOUT``, between 1 and 5 s (so a dead driver is seen in seconds)."""
    return max(1.0, min(5.0, float(settings.get(ENV_HEARTBEAT_TIMEOUT)) / 3))


class _LogPusher:
    """Batches output lines and pushes them to the driver every 0.2 s.

    It has its own connection, whose calls give up after :func:`_driver_call_timeout`: a
    push to a dead driver must not hold the connection ``client`` (the supervisor's, whose
    ``close`` waits for a running call) for ``HORA_RENDEZVOUS_TIMEOUT``, which kept the
    engine's task (a Dask worker's thread) busy for a minute after the driver was lost. A
    batch that could not be pushed is kept and pushed again (under the same sequence number)
    with the next one.
    """

    def __init__(self, client: KVClient, rank: int, timeout: float | None = None) -> None:
        self.client = client.with_timeout(_driver_call_timeout() if timeout is None else timeout)
        self.rank = rank
        self.buffer: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._flushing = threading.Lock()
        self._pending: tuple[int, list[tuple[str, str]]] | None = None  # (seq, lines) not pushed yet
        self._failing = False
        self._abandoned = False
        self.seq = itertools.count()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"hora-logs-rank{rank}", daemon=True)
        self.thread.start()

    def add(self, rank: int, stream: str, line: str) -> None:
        with self.lock:
            self.buffer.append((stream, line))

    def flush(self) -> bool:
        """Push what is buffered; False when the driver did not take it (it is kept)."""
        with self._flushing:
            with self.lock:
                if self.buffer:
                    if self._pending is None:
                        self._pending = (next(self.seq), self.buffer)
                    else:  # lines of an earlier, unpushed batch go first, under its number
                        self._pending = (self._pending[0], self._pending[1] + self.buffer)
                    self.buffer = []
                pending = self._pending
            if pending is None:
                return True
            try:
                self.client.set(keys.log_key(self.rank, pending[0]), pickle.dumps(pending[1]))
            except HoraError as exc:
                if not self._failing:  # once per outage
                    self._failing = True
                    log.warning("rank %d: could not forward %d output line(s) to the driver: %s", self.rank,
                                len(pending[1]), exc)
                return False
            self._pending, self._failing = None, False
            return True

    def _loop(self) -> None:
        while not self.stopped.wait(0.2):
            self.flush()
        if self._abandoned:
            self.client.close()

    def close(self, flush: bool = True) -> None:
        """Stop pushing; ``flush``: push what is left first. Without it (the driver is gone)
        this returns at once: a push under way ends within its timeout, then the thread ends."""
        self._abandoned = not flush
        self.stopped.set()
        if flush:
            self.thread.join(timeout=5)
            self.flush()
            self.client.close()


def worker_argv(result: str, python: str | None = None) -> list[str]:
    """The command line of the worker entry point (``result``: a file path, :data:`TO_DRIVER`
    or :data:`FROM_DRIVER`; ``python``: the interpreter, default this one)."""
    return [python or sys.executable, "-m", "hora.runners.rank.main", result]


def _dask_malloc_trim() -> str | None:
    """The ``MALLOC_TRIM_THRESHOLD_`` Dask's nanny gives its workers, when this is a Dask worker."""
    if "distributed" not in sys.modules:
        return None
    try:
        import dask

        value = (dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}).get("MALLOC_TRIM_THRESHOLD_")
    except Exception:  # noqa: BLE001 - no readable config: nothing was injected that we know of
        return None
    return None if value is None else str(value)


def worker_process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a worker subprocess starts with (the rank env is set from the spec).

    Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (freed memory goes
    back to the OS at once). Set at all, it also pins glibc's mmap threshold at 128 KiB, so a
    training rank maps and unmaps every activation and gradient buffer and spends about 40 %
    of a small model's step in page faults. A rank does not inherit that value (any other
    value, set by the user, stays).
    """
    env = dict(os.environ)
    trim = _dask_malloc_trim()
    if trim is not None and env.get("MALLOC_TRIM_THRESHOLD_") == trim:
        del env["MALLOC_TRIM_THRESHOLD_"]
    env["PYTHONUNBUFFERED"] = "1"
    env[ENV_SUPERVISOR_PID] = str(os.getpid())
    env.pop(ENV_SECRET, None)  # never inherit another job's secret
    env.update(extra or {})
    return env


def read_result(result_path: str) -> Any:
    """Load the value a worker wrote."""
    import cloudpickle

    with open(result_path, "rb") as fh:
        ok, value = cloudpickle.load(fh)
    return value


def _warm_key_env(spec: LaunchSpec) -> dict[str, str] | None:
    """The run's variables a warm rank server must have had at its imports (None: no warm
    server, ``HORA_WARM_WORKERS=0`` in this process's or the run's environment)."""
    return _warm_import_env(spec.env_dict)


def _warm_import_env(run_env: Mapping[str, str]) -> dict[str, str] | None:
    from hora.runners.rank.warm import client as warm

    if not warm.enabled({**os.environ, **run_env}):
        return None
    return {k: v for k, v in run_env.items() if not k.startswith("HORA_")}


def prestart_rank_server(run_env: Mapping[str, str]) -> bool:
    """Start, in the background, the warm rank server that :func:`supervise` in this process
    (or, in a Spark task, in any Python worker of this executor) will ask for the ranks of a
    run whose environment is ``run_env`` (``LaunchSpec.env``); False when warm ranks are off
    or it already runs. The estimators call it on the ranks' hosts while they materialize.
    """
    from hora.runners.rank.warm import client as warm

    import_env = _warm_import_env(run_env)
    if import_env is None:
        return False
    python = worker_argv("", settings.get(ENV_WORKER_PYTHON, run_env))[0]
    return warm.prestart(python, worker_process_env(), None, import_env) is not None


def supervise(spec: LaunchSpec, ctx: RankContext, poll_interval: float = 0.05) -> Any:
    """Run rank ``ctx.rank`` as a subprocess of this (engine task) process; return ``fn``'s value.

    Output lines go to the driver; when the driver aborts the run the subprocess is killed.

    Raises:
        WorkerFailedError: the rank failed, died, or the run was aborted.
    """
    from hora.runners.rank.procs import ProcessLauncher, describe_exit

    client = KVClient(spec.driver_addr, spec.secret)
    lost_after = float(settings.get(ENV_HEARTBEAT_TIMEOUT))
    check = client.with_timeout(_driver_call_timeout())  # gives up in seconds on a dead driver
    driver_lost = False
    pusher = _LogPusher(client, ctx.rank)
    launcher = ProcessLauncher(pusher.add)
    grace = float(settings.get(ENV_TERMINATE_GRACE))
    tmpdir = tempfile.mkdtemp(prefix=f"hora-{spec.run_id}-rank{ctx.rank}-")
    result_path = os.path.join(tmpdir, "result.pkl")
    watch: AbortWatch | None = None
    try:
        python = settings.get(ENV_WORKER_PYTHON, spec.env_dict)  # hora.spark.run(executable=...)
        launcher.start(ctx.rank, worker_argv(result_path, python), worker_process_env(),
                       stdin_data=pickle.dumps((spec, ctx)), warm=_warm_key_env(spec),
                       # this supervisor killed (a Spark task's Python worker): the server that then
                       # ends the rank says so, as this supervisor would have (keys.EXITED)
                       exit_report={"addr": spec.driver_addr, "secret": spec.secret.hex(),
                                    "key": keys.rank_key(keys.EXITED, ctx.rank),
                                    **({"tls": spec.tls.to_text()} if spec.tls is not None else {})})
        watch = AbortWatch(client, lambda: None, lambda reason: None, name=f"sup{ctx.rank}",
                           period=min(10.0, max(1.0, lost_after / 3)), lost_after=lost_after)
        watch.start()
        unreachable = False
        while True:
            code = launcher.poll()[ctx.rank]
            if code is not None:
                break
            unreachable = watch.lost is not None or watch.failing
            if watch.lost is not None:  # the driver is gone: stop training for nobody
                driver_lost = True
                launcher.terminate(grace)
                why = ("it closed its connections" if watch.lost == "closed"
                       else f"silent for {lost_after:.0f} s ({ENV_HEARTBEAT_TIMEOUT})")
                raise WorkerFailedError(
                    f"rank {ctx.rank}: lost the driver of run {spec.run_id} ({why}); stopped the rank",
                    rank=ctx.rank, host=ctx.hostname,
                )
            if watch.aborted:
                launcher.terminate(grace)
                raise WorkerFailedError(
                    f"rank {ctx.rank} was stopped because the driver aborted run {spec.run_id}",
                    rank=ctx.rank, host=ctx.hostname,
                )
            time.sleep(poll_interval)
        launcher.wait_output(ctx.rank)
        if code != 0:  # ended by its watchdog because the driver is gone? (the watch may be finding out)
            watch.settle()
            unreachable = watch.lost is not None or watch.failing
        if code != 0 and unreachable:  # the rank's watchdog ended it: its driver is gone too
            driver_lost = True
            raise WorkerFailedError(f"rank {ctx.rank}: exited with {describe_exit(code)} after losing the driver of "
                                    f"run {spec.run_id}", rank=ctx.rank, host=ctx.hostname, exitcode=code)
        if code == 0:
            return read_result(result_path)
        tb = launcher.traceback_of(ctx.rank)
        if not client.keys(keys.rank_key(keys.FAILED, ctx.rank)):  # killed, or died before it could report
            exc = WorkerFailedError(f"rank {ctx.rank} process died with {describe_exit(code)}")
            _post_failure(client, ctx.rank, ctx.hostname, exc, tb or "", code, died=True)
        raise WorkerFailedError(
            f"rank {ctx.rank} failed with {describe_exit(code)}",
            rank=ctx.rank, host=ctx.hostname, remote_traceback=tb, exitcode=code,
        )
    finally:
        if watch is not None:
            watch.stop()
        launcher.terminate(grace)
        pusher.close(flush=not driver_lost)  # nobody to push to or tell otherwise
        if not driver_lost:
            with contextlib.suppress(HoraError):
                check.set(keys.rank_key(keys.EXITED, ctx.rank), b"1")
        check.close()
        client.close()
        with contextlib.suppress(OSError):
            for name in os.listdir(tmpdir):
                os.unlink(os.path.join(tmpdir, name))
            os.rmdir(tmpdir)


__all__ = ["supervise", "prestart_rank_server", "worker_argv", "worker_process_env", "read_result"]
