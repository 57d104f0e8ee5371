"""The one attempt loop of every run: :func:`hora.runners.run` (``hora.run`` and the
estimators), ``hora run`` (:class:`~hora.runners.command.CommandRun`) and elastic ``hora run``
(:class:`~hora.runners.elastic.driver.ElasticRun`, whose attempts are its rounds) all use it.

A caller gives :func:`run_attempts` a *job factory*, ``start_attempt(num_proc, time_left)``:
it starts the attempt's ranks and returns a :class:`Launch` (how to watch the attempt, and
how to close it; it tears down what it built itself if it raises), and a
:class:`RelaunchPolicy`, what decides after an attempt that did not succeed.
The loop watches the attempt (:meth:`Launch.results`); a failure, or an attempt that ended
without results (:class:`AttemptEnded`: an elastic round whose ranks reset), goes to the
policy, which raises the run's final error or allows another attempt; the attempt is closed,
``next_size`` says how many ranks the next one gets (a launcher that waits for its slots,
elastic: the hosts of the next round), and the factory is called again.

The two policies: :class:`~hora.runners.driver.recovery.Attempts` (a run of fixed size: a fresh
launch of every rank after a retriable fault, ``max_failures`` times) and
:class:`~hora.runners.elastic.rounds.ElasticRounds` (elastic: blacklisted hosts,
``--reset-limit``, survivors keep running).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hora.errors import HoraError, RendezvousError, WorkerFailedError
from hora.runners.driver.monitor import Policy, watch

if TYPE_CHECKING:
    from hora.runners.driver.service import DriverService
    from hora.runners.launcher import Job

log = logging.getLogger(__name__)


class AttemptEnded(HoraError):
    """An attempt ended without the run's results and without a failure of the run: every
    rank of an elastic round left it, some to wait for the next round. Raised by a
    :attr:`Launch.watch`, handed to the :class:`RelaunchPolicy`, never out of :func:`run_attempts`
    by the policies hora has."""


class RelaunchPolicy(Protocol):
    """What :func:`run_attempts` asks after an attempt that did not succeed."""

    #: names the run in messages
    run_id: str

    def failed(self, exc: BaseException, num_proc: int, *, out_of_time: bool = False) -> None:
        """The attempt of ``num_proc`` ranks ended with ``exc`` (a WorkerFailedError, a
        RendezvousError or an :class:`AttemptEnded`): return if the run goes on, else raise
        the run's final error."""

    def relaunching(self, num_proc: int) -> None:
        """The next attempt, of ``num_proc`` ranks, is about to start (log it)."""


@dataclasses.dataclass
class Launch:
    """One started attempt.

    Attributes:
        service: the attempt's driver service.
        job: its ranks (None with ``watch``: an elastic round has a job per worker).
        policy: what the monitor enforces (None with ``watch``).
        close: closes the attempt once it is over (stop the ranks, close the service; an
            elastic round: only its failed workers, the survivors run on); called at most once.
        watch: returns the attempt's results or raises, instead of
            :func:`~hora.runners.driver.monitor.watch` of ``service``, ``job`` and ``policy``.
    """

    service: DriverService
    job: Job | None
    policy: Policy | None
    close: Callable[[], None]
    watch: Callable[[], list[Any]] | None = None

    def __post_init__(self) -> None:
        if self.watch is None and (self.job is None or self.policy is None):
            raise TypeError("a Launch without its own watch needs a job and a policy for the monitor")

    def results(self) -> list[Any]:
        """Watch the attempt until it succeeded (its results) or raise its failure."""
        if self.watch is not None:
            return self.watch()
        assert self.job is not None and self.policy is not None
        return watch(self.service, self.job, self.policy)


#: ``start_attempt(num_proc, time_left)``: start an attempt of ``num_proc`` ranks (``time_left``:
#: seconds left of the run's timeout, None without one); it tears down what it built if it raises
StartAttempt = Callable[[int, "float | None"], Launch]


def run_attempts(start_attempt: StartAttempt, attempts: RelaunchPolicy, num_proc: int, *,
                 timeout: float | None = None, next_size: Callable[[int], int] | None = None,
                 first: Launch | None = None, close_last: bool = True) -> list[Any]:
    """Start, watch and relaunch the attempts of one run; return the results of the one that succeeded.

    Args:
        start_attempt: the job factory (see :data:`StartAttempt`).
        attempts: the run's relaunch decision (:class:`RelaunchPolicy`: ``max_failures``,
            or an elastic run's rounds).
        num_proc: the ranks of the first attempt.
        timeout: seconds for every attempt together (None: no limit).
        next_size: ``next_size(num_proc)``: the ranks of the next attempt, once the launcher has
            the slots (default: the same number); it may raise the run's final error.
        first: an attempt the caller already started (``hora run`` prints its plan first);
            the loop watches it instead of starting one.
        close_last: close the last attempt when the loop ends (False: its owner does, as
            ``hora run`` does after printing why it stops); an attempt that is followed
            by another one is always closed first.

    Raises:
        WorkerFailedError, RendezvousError: the run's final error (``attempts.failed``,
            ``next_size``).
        KeyboardInterrupt: after the attempt was closed (``close_last``).
    """
    t0 = time.monotonic()
    launch = first
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - t0)
        relaunch = False
        try:
            if launch is None:
                launch = start_attempt(num_proc, left)
            return launch.results()
        except (WorkerFailedError, RendezvousError, AttemptEnded) as exc:
            out_of_time = timeout is not None and time.monotonic() - t0 >= timeout
            attempts.failed(exc, num_proc, out_of_time=out_of_time)  # raises unless the run goes on
            relaunch = True
        except KeyboardInterrupt:
            log.warning("hora run %s interrupted; stopping every rank", attempts.run_id)
            raise
        finally:
            if launch is not None and (relaunch or close_last):
                launch.close()
            launch = None
        if next_size is not None:
            num_proc = next_size(num_proc)
        attempts.relaunching(num_proc)


__all__ = ["AttemptEnded", "Launch", "RelaunchPolicy", "StartAttempt", "run_attempts"]
