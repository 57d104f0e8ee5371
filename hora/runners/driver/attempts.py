"""The one attempt loop of every run: :func:`hora.runners.run` (``hora.run`` and the
estimators) and ``hora run`` (:class:`~hora.runners.command.CommandRun`) both use it.

A caller gives :func:`run_attempts` a *job factory*, ``start_attempt(num_proc, time_left)``:
it builds the attempt's driver service, starts the ranks and returns a :class:`Launch`
(what :func:`~hora.runners.driver.monitor.watch` needs, and how to tear the attempt down;
it tears down what it built itself if it raises).
The loop watches it; a failure goes to :class:`~hora.runners.driver.recovery.Attempts`,
which raises the run's final error or allows a relaunch; the failed attempt is torn down,
``next_size`` says how many ranks the next one gets (a launcher that waits for its slots),
and the factory is called again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hora.errors import RendezvousError, WorkerFailedError
from hora.runners.driver.monitor import Policy, watch
from hora.runners.driver.recovery import Attempts

if TYPE_CHECKING:
    from hora.runners.driver.service import DriverService
    from hora.runners.launcher import Job

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Launch:
    """One started attempt.

    Attributes:
        service: the attempt's driver service.
        job: its ranks.
        policy: what the monitor enforces.
        close: tears the attempt down (stop the ranks, close the service); called once.
    """

    service: DriverService
    job: Job
    policy: Policy
    close: Callable[[], None]


#: ``start_attempt(num_proc, time_left)``: start an attempt of ``num_proc`` ranks (``time_left``:
#: seconds left of the run's timeout, None without one); it tears down what it built if it raises
StartAttempt = Callable[[int, "float | None"], Launch]


def run_attempts(start_attempt: StartAttempt, attempts: Attempts, num_proc: int, *, timeout: float | None = None,
                 next_size: Callable[[int], int] | None = None, first: Launch | None = None,
                 close_last: bool = True) -> list[Any]:
    """Start, watch and relaunch the attempts of one run; return the results of the one that succeeded.

    Args:
        start_attempt: the job factory (see :data:`StartAttempt`).
        attempts: the run's attempts and the relaunch decision (``max_failures``).
        num_proc: the ranks of the first attempt.
        timeout: seconds for every attempt together (None: no limit).
        next_size: ``next_size(num_proc)``: the ranks of the next attempt, once the launcher has
            the slots (default: the same number).
        first: an attempt the caller already started (``hora run`` prints its plan first);
            the loop watches it instead of starting one.
        close_last: tear down the last attempt when the loop ends (False: its owner does, as
            ``hora run`` does after printing why it stops); a failed attempt that is followed
            by another one is always torn down first.

    Raises:
        WorkerFailedError, RendezvousError: the run's final error
            (:meth:`~hora.runners.driver.recovery.Attempts.failed`).
        KeyboardInterrupt: after the attempt was torn down.
    """
    t0 = time.monotonic()
    launch = first
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - t0)
        relaunch = False
        try:
            if launch is None:
                launch = start_attempt(num_proc, left)
            return watch(launch.service, launch.job, launch.policy)
        except (WorkerFailedError, RendezvousError) as exc:
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


__all__ = ["Launch", "StartAttempt", "run_attempts"]
