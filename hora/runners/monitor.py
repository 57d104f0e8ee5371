"""The one monitor of every launcher: when a run succeeded, failed, or must be stopped.

Every launcher (local processes, ssh hosts, mpiexec, a Spark barrier stage, Dask tasks)
hands the monitor a :class:`~hora.runners.base.Job`; ``hora run`` and
:func:`hora.runners.run` both call :func:`watch`. The policy:

* **First failure.** A failure is a rank that raised (its own report to the driver
  service), a rank process that exited non-zero or was killed, a host whose ssh session
  broke, or an engine task that failed. Each takes a number from one counter in the
  driver service the moment it is seen (``runner/failseq``), so the failure reported is
  the one that happened *first*, not a survivor that failed because of it; the monitor
  waits (briefly) for numbers handed out before the chosen one.
* **Start.** Ranks of a function run must start within ``start_timeout``; ranks that
  reach the engine's start barrier (:func:`hora.native.keys.parse_native_init`) must
  all be there within ``start_timeout`` of the first one: the missing ranks are named.
* **End.** Ranks of a function run must finish within ``HORA_FINISH_TIMEOUT`` after the
  first one returned, and keep heartbeating (``HORA_HEARTBEAT_TIMEOUT``); an optional
  overall ``timeout``.

Raises (from :func:`watch`) :class:`~hora.errors.WorkerFailedError` (rank, host,
exit code, remote traceback), :class:`~hora.errors.RendezvousError` or ``RunTimeoutError``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from hora.errors import RendezvousError, WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import ENV_START_TIMEOUT
from hora.runners.procs import describe_exit
from hora.runners.spec import (
    DEFAULT_FINISH_TIMEOUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    ENV_FINISH_TIMEOUT,
    ENV_HEARTBEAT_TIMEOUT,
    FailureReport,
    env_seconds,
)

if TYPE_CHECKING:
    from hora.runners.base import Job
    from hora.runners.driver import DriverService

log = logging.getLogger(__name__)

FAILURE_GRACE = 3.0  # seconds to wait for failures numbered before the first one seen (output drain: 2 s)


class RunTimeoutError(WorkerFailedError, TimeoutError):
    """Ranks did not finish in time (``timeout`` of :func:`hora.runners.run`, or
    ``HORA_FINISH_TIMEOUT`` after another rank had already returned)."""


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed rank (or host), as a launcher or the driver service saw it.

    Attributes:
        seq: its number from the driver service's failure counter (lower = earlier).
        rank: the rank (for a host: its first rank; None when unknown).
        host: the host it ran on.
        message: one line: ``"failed with exit code 3"``, ``"ValueError: ..."``, ssh's error.
        traceback: the rank's traceback (or its last stderr lines), if any.
        exitcode: the process exit code (Popen's: ``-N`` for signal N), if it was a process.
    """

    seq: int
    rank: int | None
    host: str | None
    message: str
    traceback: str | None = None
    exitcode: int | None = None

    @classmethod
    def from_report(cls, report: FailureReport) -> Failure:
        return cls(seq=report.seq, rank=report.rank, host=report.host, message=f"raised {report.error}",
                   traceback=report.traceback or None, exitcode=report.exitcode)

    @classmethod
    def from_exit(cls, seq: int, rank: int, host: str, code: int, traceback: str | None) -> Failure:
        return cls(seq=seq, rank=rank, host=host, message=f"failed with {describe_exit(code)}",
                   traceback=traceback, exitcode=code)

    def error(self) -> WorkerFailedError:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        where = f" on {self.host}" if self.host else ""
        return WorkerFailedError(f"{who}{where} {self.message}", rank=self.rank, host=self.host,
                                 remote_traceback=self.traceback, exitcode=self.exitcode)


def _collect(service: DriverService, job: Job, extra: list[Failure]) -> list[Failure]:
    return [*job.failures(), *(Failure.from_report(r) for r in service.failures()), *extra]


def first_failure(service: DriverService, job: Job, failures: list[Failure], extra: list[Failure]) -> Failure:
    """The earliest failure, after waiting up to :data:`FAILURE_GRACE` s for failures
    numbered before it; details of the same rank seen elsewhere are merged in."""
    deadline = time.monotonic() + FAILURE_GRACE
    while True:
        first = min(failures, key=lambda f: f.seq)
        seen = {f.seq for f in failures}
        if all(s in seen for s in range(1, first.seq)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        failures = _collect(service, job, extra)
    same = [f for f in failures if f is not first and f.rank == first.rank and f.rank is not None]
    traceback = first.traceback or next((f.traceback for f in same if f.traceback), None)
    exitcode = first.exitcode if first.exitcode is not None else next((f.exitcode for f in same
                                                                        if f.exitcode is not None), None)
    host = first.host or next((f.host for f in same if f.host), None)
    return dataclasses.replace(first, traceback=traceback, exitcode=exitcode, host=host)


def start_stragglers(server_keys: list[str], num_proc: int) -> dict[str, list[int]]:
    """``{barrier: missing ranks}`` for the engine start barriers some ranks reached."""
    arrived: dict[str, set[int]] = {}
    for key in server_keys:
        arrival = keys.parse_barrier_key(key)
        if arrival is not None and keys.parse_native_init(arrival.name) is not None:
            arrived.setdefault(arrival.name, set()).add(arrival.rank)
    return {name: sorted(set(range(num_proc)) - ranks) for name, ranks in arrived.items()
            if len(ranks) < num_proc}


@dataclasses.dataclass
class Policy:
    """What :func:`watch` enforces for one run.

    Attributes:
        num_proc: the number of ranks.
        run_id: names the run in messages.
        start_timeout: seconds for every rank to start / reach the engine's start barrier.
        functions: the ranks are hora workers running a function (they report start,
            heartbeats and completion to the driver service); False for commands.
        timeout: optional limit for the whole run.
        poll_interval: seconds between checks.
    """

    num_proc: int
    run_id: str
    start_timeout: float
    functions: bool = True
    timeout: float | None = None
    poll_interval: float = 0.1


def watch(service: DriverService, job: Job, policy: Policy) -> list[Any]:
    """Watch ``job`` until every rank succeeded; return its results (rank order).

    Raises:
        WorkerFailedError: the first failure (see the module docstring).
        RendezvousError: ranks never started, or never reached the engine's start barrier.
        RunTimeoutError: the run exceeded ``timeout``, or ranks hung after others returned.
    """
    n = policy.num_proc
    hb_timeout = env_seconds(ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT)
    finish_timeout = env_seconds(ENV_FINISH_TIMEOUT, DEFAULT_FINISH_TIMEOUT)
    t0 = time.monotonic()
    first_done_at: float | None = None
    barrier_seen: dict[str, float] = {}
    extra: list[Failure] = []  # failures raised by job.poll() (engine tasks)
    while True:
        results = None
        try:
            results = job.poll()
        except WorkerFailedError as exc:
            extra.append(Failure(seq=service.next_seq(), rank=exc.rank, host=exc.host, message=exc.message,
                                 traceback=exc.remote_traceback, exitcode=exc.exitcode))
        failures = _collect(service, job, extra)
        if failures:
            first = first_failure(service, job, failures, extra)
            log.debug("run %s: first failure %s", policy.run_id, first)
            raise first.error()
        if results is not None:
            if len(results) != n:
                raise WorkerFailedError(f"expected {n} results, got {len(results)}")
            return results
        now = time.monotonic()
        started: dict[int, str] = {}
        if policy.functions:
            started = service.started()
            if len(started) < n and now - t0 > policy.start_timeout:
                missing = sorted(set(range(n)) - set(started))
                raise RendezvousError(
                    f"rank(s) {missing} of run {policy.run_id} never started within {policy.start_timeout:g}s "
                    f"({len(started)} of {n} started; raise start_timeout or {ENV_START_TIMEOUT} if the "
                    "cluster is slow)")
        for name, missing in start_stragglers(service.server.keys(keys.BARRIER), n).items():
            seen = barrier_seen.setdefault(name, now)
            if now - seen > policy.start_timeout:
                raise RendezvousError(
                    f"rank(s) {missing} never arrived at rendezvous '{name}' within {policy.start_timeout:g}s "
                    f"of the first rank (--start-timeout / {ENV_START_TIMEOUT})")
        if policy.functions:
            done = service.done()
            if done and first_done_at is None:
                first_done_at = now
            if first_done_at is not None and len(done) < n and now - first_done_at > finish_timeout:
                missing = sorted(set(range(n)) - done)
                raise RunTimeoutError(
                    f"rank(s) {missing} did not finish within {finish_timeout:g}s after rank(s) {sorted(done)} "
                    f"returned (hanging? raise {ENV_FINISH_TIMEOUT} if this is expected)",
                    rank=missing[0], host=started.get(missing[0]))
            stale = service.stale_heartbeats(hb_timeout, ignore=done)
            if stale:
                raise WorkerFailedError(
                    f"rank(s) {stale} stopped sending heartbeats for {hb_timeout:g}s: their process or machine died",
                    rank=stale[0], host=started.get(stale[0]))
        if policy.timeout is not None and now - t0 > policy.timeout:
            missing = sorted(set(range(n)) - (service.done() if policy.functions else set()))
            raise RunTimeoutError(
                f"run {policy.run_id} did not finish within timeout={policy.timeout:g}s; rank(s) {missing} still running",
                rank=missing[0] if missing else None, host=started.get(missing[0]) if missing else None)
        time.sleep(policy.poll_interval)


__all__ = ["Failure", "Policy", "RunTimeoutError", "watch", "first_failure", "start_stragglers"]
