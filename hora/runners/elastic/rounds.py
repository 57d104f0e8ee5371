"""The relaunch decision of an elastic run: :class:`ElasticRounds`, the
:class:`~hora.runners.driver.attempts.RelaunchPolicy` that :func:`~hora.runners.driver.attempts.run_attempts`
asks when a round ended (horovodrun's rules; :mod:`hora.runners.elastic.driver` runs the rounds).

A round ends when every worker of it has left it (:class:`RoundEnded`, unless every one
succeeded): *ready* (it reset and waits for its next place), *failed* (exited non-zero,
killed, lost) or *succeeded* (exited 0). The run fails, naming the root cause (the first
failure of the round, as the class of its kind), when a worker succeeded while others did
not, when every worker failed, when every host of the round is blacklisted once the hosts of
the failed workers are, or when ``--reset-limit`` rounds have been reset already; otherwise
the run goes on with a next round.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

from hora.errors import WorkerFailedError
from hora.runners.driver.attempts import AttemptEnded
from hora.runners.driver.faults import Failure

log = logging.getLogger(__name__)

READY, SUCCESS, FAILURE = "ready", "success", "failure"
RESET_LIMIT_MESSAGE = "the job has been reset {} times, the --reset-limit"


@dataclasses.dataclass(frozen=True)
class Left:
    """How one worker left a round.

    Attributes:
        name: the worker (``host[slot]``).
        rank: its rank in the round.
        host: its host.
        state: :data:`READY`, :data:`SUCCESS` or :data:`FAILURE`.
    """

    name: str
    rank: int
    host: str
    state: str


class RoundEnded(AttemptEnded):
    """Every worker of round ``round`` left it, not all by succeeding.

    Attributes:
        round: the round's number (1, 2, ...).
        workers: how each worker left it.
        failures: the round's failed workers, as the driver saw them (rank and host of the round).
    """

    def __init__(self, round: int, workers: tuple[Left, ...], failures: tuple[Failure, ...] = ()) -> None:
        self.round = round
        self.workers = workers
        self.failures = failures
        states = ", ".join(f"{w.name}={w.state}" for w in workers)
        super().__init__(f"round {round} ended: {states}")

    def ranks(self, *states: str) -> list[int]:
        """The sorted ranks of the workers that left in one of ``states``."""
        return sorted(w.rank for w in self.workers if w.state in states)


class Blacklist(Protocol):
    """The hosts' blacklist (:class:`~hora.runners.elastic.discovery.HostManager`)."""

    def blacklist(self, host: str) -> None: ...

    def is_blacklisted(self, host: str) -> bool: ...


class ElasticRounds:
    """The rounds of one elastic run and the decision after each (module docstring).

    Args:
        run_id: names the run in messages.
        hosts: the blacklist the failed workers' hosts go on.
        reset_limit: the most rounds after the first (None: no limit).
    """

    def __init__(self, run_id: str, hosts: Blacklist, reset_limit: int | None = None) -> None:
        self.run_id = run_id
        self.hosts = hosts
        self.reset_limit = reset_limit
        self.resets = 0
        self.round = 1  # the last round that ended (or the first, before any did)
        self.failures: list[tuple[int, Failure]] = []  # (round, failure) of every round so far

    def failed(self, exc: BaseException, num_proc: int, *, out_of_time: bool = False) -> None:
        """Decide after a round: return if the run goes on (the failed workers' hosts are then
        blacklisted and the round counts as a reset), else raise the run's final error.

        Raises:
            WorkerFailedError: the run fails (the root cause and why it is not recovered from).
            BaseException: ``exc`` itself when it is not a :class:`RoundEnded` (a worker that
                cannot be started, workers stuck in a round: the run's error as it is).
        """
        if not isinstance(exc, RoundEnded):
            raise exc
        self.round = exc.round
        self.failures.extend((exc.round, f) for f in exc.failures)
        done, failed, ready = exc.ranks(SUCCESS), exc.ranks(FAILURE), exc.ranks(READY)
        if done:
            raise self.root_error(f"rank(s) {done} finished while rank(s) {sorted(failed + ready)} did not")
        if not ready:
            raise self.root_error(f"every rank of round {exc.round} failed")
        for w in exc.workers:
            if w.state == FAILURE:
                self.hosts.blacklist(w.host)
        if all(self.hosts.is_blacklisted(w.host) for w in exc.workers):
            raise self.root_error(f"every host of round {exc.round} is blacklisted")
        if self.reset_limit is not None and self.resets >= self.reset_limit:
            raise self.root_error(RESET_LIMIT_MESSAGE.format(self.resets))
        self.resets += 1

    def relaunching(self, num_proc: int) -> None:
        """Log the next round (once the hosts offer its slots)."""
        log.info("elastic run %s: round %d reset (%d of %s); the next has %d rank(s)", self.run_id, self.round,
                 self.resets, self.reset_limit if self.reset_limit is not None else "unlimited", num_proc)

    def root_error(self, why: str) -> WorkerFailedError:
        """The run's final error: the first failure of the last round that ended (else of any
        earlier round), as the class of its kind (``RankKilledError``, ...), with ``why``."""
        failures = [f for r, f in self.failures if r == self.round] or [f for _, f in self.failures]
        if not failures:
            return WorkerFailedError(f"elastic run {self.run_id}: {why}")
        err = min(failures, key=lambda f: f.seq).error()
        return type(err)(f"{err.message}; {why}", rank=err.rank, host=err.host,
                         remote_traceback=err.remote_traceback, exitcode=err.exitcode)


__all__ = ["ElasticRounds", "Left", "RoundEnded", "READY", "SUCCESS", "FAILURE", "RESET_LIMIT_MESSAGE"]
