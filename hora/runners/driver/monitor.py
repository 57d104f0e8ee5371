"""The one monitor of every launcher: when a run succeeded, failed, or must be stopped.

Every launcher (local processes, ssh hosts, mpiexec, a Spark barrier stage, Dask tasks)
hands the monitor a :class:`~hora.runners.launcher.Job`; ``hora run`` and
:func:`hora.runners.run` both call :func:`watch`. The policy:

* **Root cause.** A failure is a rank that raised (its own report to the driver
  service), a rank process that exited non-zero or was killed, a host whose ssh session
  broke, or an engine task that failed. Each takes a number from one counter in the
  driver service the moment it is seen (``runner/failseq``) and has a
  :class:`~hora.runners.driver.faults.FaultKind`. The failure reported is the earliest one that
  is not a *symptom* (a survivor's CollectiveError "rank 1 is unreachable", a reset
  connection, a Spark task that failed because its rank did): a SIGKILL of rank 1 is
  reported as rank 1's even when rank 0's CollectiveError reached the driver first. The
  monitor waits (briefly, :data:`FAILURE_GRACE`) for numbers handed out before the chosen
  one, and while only symptoms are known and some ranks are unaccounted for, up to
  ``HORA_ROOT_CAUSE_GRACE`` s (default 10) for the lost rank to be seen.
* **Start.** Ranks of a function run must start within ``start_timeout``; ranks that
  reach the engine's start barrier (:func:`hora.native.keys.parse_native_init`) must
  all be there within ``start_timeout`` of the first one: the missing ranks are named.
* **End.** Ranks of a function run must finish within ``HORA_FINISH_TIMEOUT`` after the
  first one returned, and keep heartbeating (``HORA_HEARTBEAT_TIMEOUT``); an optional
  overall ``timeout``.

Raises (from :func:`watch`) the :class:`~hora.errors.WorkerFailedError` subclass of the root
cause's kind (rank, host, exit code, remote traceback), :class:`~hora.errors.RanksNotStartedError`
(a ``RendezvousError``) or :class:`~hora.errors.RunTimeoutError`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from hora import settings
from hora.errors import RanksNotStartedError, RunTimeoutError, WorkerFailedError, WorkerLostError
from hora.native import keys
from hora.native.rendezvous import ENV_START_TIMEOUT
from hora.runners.driver.faults import Failure, FaultKind
from hora.runners.spec import (
    ENV_FINISH_TIMEOUT,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_ROOT_CAUSE_GRACE,
)

if TYPE_CHECKING:
    from hora.runners.launcher import Job
    from hora.runners.driver.service import DriverService

log = logging.getLogger(__name__)

FAILURE_GRACE = 3.0  # seconds to wait for failures numbered before the first one seen (output drain: 2 s)


class _Collector:
    """Every failure seen so far: the launcher's, the ranks' reports, and engine failures
    that ``job.poll()`` raised (each recorded once, numbered when first seen)."""

    def __init__(self, service: DriverService, job: Job) -> None:
        self.service = service
        self.job = job
        self.engine: list[Failure] = []
        self._seen: set[tuple[int | None, str]] = set()
        self.results: list[Any] | None = None

    def poll(self) -> None:
        try:
            self.results = self.job.poll()
        except WorkerFailedError as exc:
            key = (exc.rank, exc.message)
            if key not in self._seen:
                self._seen.add(key)
                self.engine.append(self._engine_failure(exc))

    def _engine_failure(self, exc: WorkerFailedError) -> Failure:
        """A failure ``job.poll()`` raised: its class's kind (a launcher reads its engine's own
        error at its boundary: a lost Spark executor is a :class:`~hora.errors.WorkerLostError`);
        an unclassified one is a killed process (a negative exit code) or a failed task."""
        seq = self.service.next_seq()
        kind = type(exc).kind
        if kind is None:
            kind = FaultKind.SIGNAL if (exc.exitcode or 0) < 0 else FaultKind.TASK
        host = exc.host or (self.service.started().get(exc.rank) if exc.rank is not None else None)
        return Failure(seq=seq, rank=exc.rank, host=host, message=exc.message, traceback=exc.remote_traceback,
                       exitcode=exc.exitcode, kind=kind, source="engine")

    def failures(self) -> list[Failure]:
        return [*_observed(self.service, self.job), *self.engine]


def _observed(service: DriverService, job: Job) -> list[Failure]:
    return [*job.failures(), *(Failure.from_report(r) for r in service.failures())]


def _merge(group: list[Failure]) -> Failure:
    """One rank's failures as one: its own report if it posted one (else what was seen
    first), numbered by the first of them, with details the others add."""
    ordered = sorted(group, key=lambda f: f.seq)
    reports = [f for f in ordered if f.source == "rank"]
    observed = [f for f in ordered if f.source != "engine"]
    base = (reports or observed or ordered)[0]
    traceback = base.traceback or next((f.traceback for f in ordered if f.traceback), None)
    exitcode = base.exitcode if base.exitcode is not None else next((f.exitcode for f in ordered
                                                                     if f.exitcode is not None), None)
    host = base.host or next((f.host for f in ordered if f.host), None)
    return dataclasses.replace(base, seq=ordered[0].seq, traceback=traceback, exitcode=exitcode, host=host)


def root_causes(failures: list[Failure]) -> list[Failure]:
    """One failure per rank (:func:`_merge`) plus those of no rank, earliest first."""
    by_rank: dict[int, list[Failure]] = {}
    out = []
    for f in failures:
        if f.rank is None:
            out.append(f)
        else:
            by_rank.setdefault(f.rank, []).append(f)
    out += [_merge(group) for group in by_rank.values()]
    return sorted(out, key=lambda f: f.seq)


def _pick(causes: list[Failure]) -> Failure:
    return next((f for f in causes if not f.kind.symptom), causes[0])


def first_failure(service: DriverService, job: Job, failures: list[Failure], extra: list[Failure] | None = None,
                  *, num_proc: int | None = None, collector: _Collector | None = None) -> Failure:
    """The root cause among ``failures``: the earliest failure that is not a symptom of
    another rank's loss (:mod:`hora.runners.driver.faults`), else the earliest one.

    It waits up to :data:`FAILURE_GRACE` s for failures numbered before the chosen one,
    and, while the chosen one is a symptom and some of the ``num_proc`` ranks are not yet
    accounted for (failed or done), up to ``HORA_ROOT_CAUSE_GRACE`` s for the lost rank to
    be seen. Details of the same rank seen elsewhere are merged in.
    """
    extra = list(extra or [])

    def collect() -> list[Failure]:
        if collector is None:
            return [*_observed(service, job), *extra]
        collector.poll()  # engine failures (a lost Dask worker) keep arriving while we wait
        return [*collector.failures(), *extra]

    now = time.monotonic()
    gap_deadline = now + FAILURE_GRACE
    symptom_deadline = now + float(settings.get(ENV_ROOT_CAUSE_GRACE))
    while True:
        causes = root_causes(failures)
        chosen = _pick(causes)
        seen = {f.seq for f in failures}
        now = time.monotonic()
        gap = not all(s in seen for s in range(1, chosen.seq)) and now < gap_deadline
        waiting = False
        if chosen.kind.symptom and num_proc is not None and now < symptom_deadline:
            accounted = {f.rank for f in failures if f.rank is not None} | service.done() | job.ended()
            waiting = not set(range(num_proc)) <= accounted
        if not (gap or waiting):
            return chosen
        time.sleep(0.05)
        failures = collect()


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
        timeout: optional limit, in seconds, for this attempt (what is left of the run's).
        given_timeout: the run's timeout as its caller gave it, which a timeout's message
            names (default: ``timeout``).
        poll_interval: seconds between checks.
    """

    num_proc: int
    run_id: str
    start_timeout: float
    functions: bool = True
    timeout: float | None = None
    given_timeout: float | None = None
    poll_interval: float = 0.05  # (as hora run's commands): a run ends at most this long after its last rank


def watch(service: DriverService, job: Job, policy: Policy) -> list[Any]:
    """Watch ``job`` until every rank succeeded; return its results (rank order).

    Raises:
        WorkerFailedError: the first failure, as the subclass of its kind (see the module docstring).
        RanksNotStartedError: ranks never started, or never reached the engine's start barrier
            (a RendezvousError).
        RunTimeoutError: the run exceeded ``timeout``, or ranks hung after others returned.
    """
    n = policy.num_proc
    hb_timeout = float(settings.get(ENV_HEARTBEAT_TIMEOUT))
    finish_timeout = float(settings.get(ENV_FINISH_TIMEOUT))
    t0 = time.monotonic()
    first_done_at: float | None = None
    barrier_seen: dict[str, float] = {}
    all_started = False
    collector = _Collector(service, job)
    while True:
        collector.poll()
        results = collector.results
        failures = collector.failures()
        if failures:
            log.debug("run %s: failure(s) seen: %s", policy.run_id, "; ".join(f.describe() for f in failures))
            first = first_failure(service, job, failures, num_proc=n, collector=collector)
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
            if len(started) == n and not all_started:
                all_started = True
                log.debug("run %s: all %d rank(s) started, %.2f s after the watch began", policy.run_id, n, now - t0)
            if len(started) < n and now - t0 > policy.start_timeout:
                missing = sorted(set(range(n)) - set(started))
                raise RanksNotStartedError(
                    f"rank(s) {missing} of run {policy.run_id} never started within {policy.start_timeout:g}s "
                    f"({len(started)} of {n} started; raise start_timeout or {ENV_START_TIMEOUT} if the "
                    "cluster is slow)")
        for name, missing in start_stragglers(service.barrier_keys(), n).items():
            seen = barrier_seen.setdefault(name, now)
            if now - seen > policy.start_timeout:
                raise RanksNotStartedError(
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
                raise WorkerLostError(
                    f"rank(s) {stale} stopped sending heartbeats for {hb_timeout:g}s: their process or machine died",
                    rank=stale[0], host=started.get(stale[0]))
        if policy.timeout is not None and now - t0 > policy.timeout:
            missing = sorted(set(range(n)) - (service.done() if policy.functions else set()))
            raise RunTimeoutError(
                f"run {policy.run_id} did not finish within timeout="
                f"{policy.timeout if policy.given_timeout is None else policy.given_timeout:g}s; rank(s) {missing} "
                "still running",
                rank=missing[0] if missing else None, host=started.get(missing[0]) if missing else None)
        time.sleep(policy.poll_interval)


__all__ = ["Failure", "Policy", "RunTimeoutError", "watch", "first_failure", "root_causes", "start_stragglers"]
