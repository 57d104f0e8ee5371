"""Relaunching a run that lost a rank: ``max_failures`` of :func:`hora.runners.run`,
``hora.run`` and ``hora run --max-failures``.

A run is a sequence of *attempts*. Each attempt is a complete launch: a fresh driver
service (new port, new secret: nothing of a dead attempt can write into the next one),
new rank processes / a new Spark barrier stage / new pinned Dask tasks, watched by the
one monitor. When an attempt fails, the monitor's root cause
(:func:`hora.runners.driver.monitor.first_failure`) decides:

* a **retriable** fault (:mod:`hora.runners.driver.faults`: a rank killed by a signal, a lost
  host, executor or Dask worker, ranks that never started, a rendezvous or connection
  error with no other cause) is logged, with the rank and host that were lost and how,
  and the run is launched again, up to ``max_failures`` times;
* anything else (an exception in the user's function, a CollectiveError of ranks that
  disagree, a timeout) fails the run at once, as without ``max_failures``.

Ranks learn which attempt they are in from ``HORA_ATTEMPT`` (1, 2, ...), so a function
can resume from its own checkpoint. When the last allowed attempt fails too, the error
names every attempt's cause (``.attempts`` holds them as :class:`AttemptRecord`).

:class:`Attempts` is the :class:`~hora.runners.driver.attempts.RelaunchPolicy` of the one attempt
loop (:func:`~hora.runners.driver.attempts.run_attempts`) for these runs of fixed size; an elastic
run's rounds have their own (:class:`~hora.runners.elastic.rounds.ElasticRounds`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from hora.errors import ConfigError, FaultKind, RendezvousError, WorkerFailedError, failure_class
from hora.runners.driver.faults import fault_kind

if TYPE_CHECKING:
    from hora.runners.launcher import Launcher

log = logging.getLogger(__name__)

#: seconds between two looks at the cluster while a relaunch waits for slots (a lost Spark executor
#: replaced, a Dask worker back): the relaunch follows the replacement within this
SLOT_POLL_INTERVAL = 0.1


def check_max_failures(value: object, name: str = "max_failures") -> int:
    """``value`` if it is an int >= 0.

    Raises:
        ConfigError: it is not (the message names ``name``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an int >= 0 (the number of relaunches after a lost rank), got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """How one attempt of a run ended.

    Attributes:
        attempt: 1 for the first launch, 2 for the first relaunch, ...
        num_proc: its ranks.
        cause: one line naming the root cause (``rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)``).
        kind: the root cause's kind (retriable or not).
        rank, host: who failed first (None when unknown).
    """

    attempt: int
    num_proc: int
    cause: str
    kind: FaultKind
    rank: int | None = None
    host: str | None = None

    def line(self) -> str:
        """``attempt 1 (2 ranks): rank 1 on h failed with signal 9 (SIGKILL) [a rank was killed]``."""
        return f"attempt {self.attempt} ({self.num_proc} rank{'s' if self.num_proc != 1 else ''}): {self.cause} " \
               f"[{self.kind.description}]"


def _cause_of(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class Attempts:
    """The attempts of one run and the decision after each failure.

    Args:
        run_id: names the run in messages.
        max_failures: relaunches allowed after retriable failures.
        where: the launcher's name, for the log lines.
    """

    def __init__(self, run_id: str, max_failures: int, where: str = "launcher") -> None:
        self.run_id = run_id
        self.max_failures = check_max_failures(max_failures)
        self.where = where
        self.number = 1
        self.records: list[AttemptRecord] = []

    @property
    def total(self) -> int:
        """The most attempts the run may make."""
        return self.max_failures + 1

    def label(self) -> str | None:
        """``"attempt 2 of 3"`` once the run has been relaunched (None for the first attempt)."""
        return None if self.number == 1 else f"attempt {self.number} of {self.total}"

    def failed(self, exc: BaseException, num_proc: int, *, out_of_time: bool = False) -> None:
        """Record that the current attempt failed with ``exc``; return if the run goes on
        (the attempt number is then the next one's), else raise the run's final error.

        Raises:
            WorkerFailedError, RendezvousError: the final error (``exc`` itself when the
                run was never relaunched; else one naming every attempt).
        """
        kind = fault_kind(exc)
        record = AttemptRecord(self.number, num_proc, _cause_of(exc), kind, getattr(exc, "rank", None),
                               getattr(exc, "host", None))
        self.records.append(record)
        if not kind.retriable or self.number > self.max_failures or out_of_time:
            final = self.final_error(exc, out_of_time=out_of_time)
            if final is exc:
                raise exc
            raise final from exc
        self.number += 1
        log.warning("run %s: attempt %d of %d failed: %s (%s, retriable)", self.run_id, record.attempt, self.total,
                    record.cause, kind.description)

    def relaunching(self, num_proc: int) -> None:
        """Log the relaunch that :meth:`failed` allowed (once the launcher has the slots)."""
        log.warning("run %s: relaunching %d rank(s) on %s (attempt %d of %d)", self.run_id, num_proc, self.where,
                    self.number, self.total)

    def final_error(self, exc: BaseException, *, out_of_time: bool = False) -> BaseException:
        """The error the run raises after its last attempt failed with ``exc``."""
        if len(self.records) == 1 and not out_of_time:
            return exc  # never relaunched: exactly the error of a run without max_failures
        last = self.records[-1]
        if out_of_time and last.kind.retriable:
            why = "no time was left for another attempt (timeout)"
        elif last.kind.retriable:
            why = f"{len(self.records)} attempts failed (max_failures={self.max_failures})"
        else:
            why = f"attempt {last.attempt} failed with {last.kind.description}, which is not retried"
        lines = [f"run {self.run_id}: {why}; the last: {last.cause}"]
        lines += [f"  {r.line()}" for r in self.records]
        message = "\n".join(lines)
        if not isinstance(exc, (WorkerFailedError, RendezvousError)):
            return exc
        # the class of the last attempt's kind (a RendezvousError's: RanksNotStartedError, itself one)
        new = failure_class(last.kind)(message, rank=getattr(exc, "rank", None), host=getattr(exc, "host", None),
                                       remote_traceback=getattr(exc, "remote_traceback", None),
                                       exitcode=getattr(exc, "exitcode", None))
        new.attempts = tuple(self.records)  # type: ignore[attr-defined]
        return new


def start_size(launcher: Launcher, least: int, most: int) -> int:
    """The ranks of a first attempt with bounds: as many as ``launcher`` has slots for now,
    at most ``most``.

    Raises:
        ConfigError: the cluster has fewer than ``least`` slots (naming the launcher and its slots).
    """
    slots = launcher.default_num_proc()
    if slots < least:
        raise ConfigError(f"min_num_proc={least}, but the {launcher.name} launcher has {slots} slot(s) now")
    return min(most, slots)


def wait_for_slots(launcher: Launcher, least: int, most: int, timeout: float, run_id: str) -> int:
    """The ranks of the next attempt: as many as the launcher has free slots for now
    (:meth:`~hora.runners.launcher.Launcher.refresh_slots`, then its slots), at most ``most``;
    waits (at most ``timeout`` s) while it has fewer than ``least`` (a lost executor or Dask
    worker coming back).

    Raises:
        ConfigError: the cluster still lacks ``least`` slots (the launcher's message, and how long it waited).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            launcher.refresh_slots()
            size = most
            if least < most:
                size = max(least, min(most, launcher.default_num_proc()))
            launcher.check_num_proc(size)
            return size
        except ConfigError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(f"run {run_id} cannot be relaunched: {exc} (waited {timeout:g}s for the "
                                  "cluster to recover)") from None
        time.sleep(SLOT_POLL_INTERVAL)


__all__ = ["AttemptRecord", "Attempts", "check_max_failures", "start_size", "wait_for_slots"]
