"""The relaunch decision of an elastic run (:class:`hora.runners.elastic.rounds.ElasticRounds`)
on its own, and its rounds as the attempts of the one attempt loop (``run_attempts``).

The hosts' blacklist is the real :class:`~hora.runners.elastic.discovery.HostManager`; the
end-to-end runs (real ``hora run``, real workers) are ``test_elastic_run.py``.
"""

from __future__ import annotations

import pytest

from hora.errors import RankError, RankKilledError, RendezvousError, WorkerFailedError
from hora.runners.driver.attempts import Launch, run_attempts
from hora.runners.driver.faults import Failure
from hora.runners.elastic.discovery import HostManager
from hora.runners.elastic.rounds import (FAILURE, READY, RESET_LIMIT_MESSAGE, SUCCESS, ElasticRounds, Left,
                                         RoundEnded)

KILLED_ON_B = Failure.from_exit(seq=4, rank=1, host="b", code=-9, traceback=None)


def _hosts() -> HostManager:
    hosts = HostManager(lambda: {"a": 1, "b": 1, "c": 1})
    hosts.update()
    return hosts


def _round(number: int, *states: tuple[str, str], failures: tuple[Failure, ...] = ()) -> RoundEnded:
    """A round whose worker of rank i ran on host ``states[i][0]`` and left as ``states[i][1]``."""
    return RoundEnded(number, tuple(Left(f"{h}[0]", i, h, s) for i, (h, s) in enumerate(states)), failures)


def test_a_failed_worker_blacklists_its_host_and_the_round_is_a_reset():
    hosts = _hosts()
    rounds = ElasticRounds("r1", hosts, reset_limit=None)
    rounds.failed(_round(1, ("a", READY), ("b", FAILURE), failures=(KILLED_ON_B,)), 2)  # goes on
    assert hosts.is_blacklisted("b") and not hosts.is_blacklisted("a")
    assert rounds.resets == 1 and rounds.round == 1
    rounds.failed(_round(2, ("a", READY), ("c", READY)), 2)  # the hosts changed: every worker reset
    assert rounds.resets == 2 and not hosts.is_blacklisted("c")


def test_every_rank_failed_raises_the_first_failure_as_its_kind():
    rounds = ElasticRounds("r1", _hosts())
    later = Failure.from_exit(seq=9, rank=0, host="a", code=3, traceback="Traceback\nValueError: x")
    with pytest.raises(RankKilledError) as info:
        rounds.failed(_round(1, ("a", FAILURE), ("b", FAILURE), failures=(later, KILLED_ON_B)), 2)
    assert str(info.value.message) == "rank 1 on b failed with signal 9 (SIGKILL); every rank of round 1 failed"
    assert (info.value.rank, info.value.host, info.value.exitcode) == (1, "b", -9)


def test_a_rank_that_finished_while_others_did_not_fails_the_run():
    rounds = ElasticRounds("r1", _hosts())
    with pytest.raises(RankKilledError, match=r"; rank\(s\) \[0\] finished while rank\(s\) \[1, 2\] did not$"):
        rounds.failed(_round(1, ("a", SUCCESS), ("b", FAILURE), ("c", READY), failures=(KILLED_ON_B,)), 3)


def test_every_host_of_the_round_blacklisted_fails_the_run():
    hosts = _hosts()
    rounds = ElasticRounds("r1", hosts)
    lost = Failure.lost(seq=2, rank=0, host="b", message="was lost: ssh closed")
    with pytest.raises(WorkerFailedError, match=r"every host of round 3 is blacklisted$") as info:
        rounds.failed(_round(3, ("b", FAILURE), ("b", READY), failures=(lost,)), 2)
    assert info.value.host == "b" and hosts.is_blacklisted("b")


def test_the_reset_limit_counts_rounds_after_the_first():
    rounds = ElasticRounds("r1", _hosts(), reset_limit=1)
    rounds.failed(_round(1, ("a", READY), ("b", READY)), 2)
    with pytest.raises(WorkerFailedError) as info:
        rounds.failed(_round(2, ("a", READY), ("b", READY)), 2)
    assert type(info.value) is WorkerFailedError  # no worker failed: no kind to name
    assert str(info.value) == f"elastic run r1: {RESET_LIMIT_MESSAGE.format(1)}"
    assert rounds.resets == 1


def test_the_root_cause_is_of_the_last_round_else_of_an_earlier_one():
    rounds = ElasticRounds("r1", _hosts(), reset_limit=1)
    rounds.failed(_round(1, ("a", READY), ("b", FAILURE), failures=(KILLED_ON_B,)), 2)
    error = rounds.root_error("no state to broadcast")
    assert isinstance(error, RankKilledError) and error.message.endswith("SIGKILL); no state to broadcast")
    with pytest.raises(RankKilledError, match="reset 1 times"):  # round 2 had no failure: round 1's cause
        rounds.failed(_round(2, ("a", READY), ("c", READY)), 2)
    rounds = ElasticRounds("r2", _hosts())
    rounds.failed(_round(1, ("a", READY), ("b", FAILURE), failures=(KILLED_ON_B,)), 2)
    raised = Failure.from_exit(seq=7, rank=0, host="c", code=1, traceback="Traceback\nValueError: bad")
    with pytest.raises(RankError, match="every rank of round 2 failed"):  # round 2's own cause
        rounds.failed(_round(2, ("c", FAILURE), failures=(raised,)), 1)


def test_other_errors_are_the_run_s_error_as_they_are():
    rounds = ElasticRounds("r1", _hosts())
    stuck = RendezvousError("worker(s) ['a[0]'] of round 1 neither reset nor ended")
    with pytest.raises(RendezvousError) as info:
        rounds.failed(stuck, 2)
    assert info.value is stuck and rounds.resets == 0


def test_rounds_are_the_attempts_of_the_one_loop():
    """Survivors keep running: only the ended rounds are closed, the last one by its owner."""
    hosts = _hosts()
    rounds = ElasticRounds("r1", hosts)
    ends = iter([_round(1, ("a", READY), ("b", FAILURE), failures=(KILLED_ON_B,)),
                 _round(2, ("a", READY), ("c", READY)), None])
    closed: list[int] = []
    started: list[int] = []
    sizes: list[int] = []

    def launch(number: int) -> Launch:
        def watch() -> list[object]:
            end = next(ends)
            if end is not None:
                raise end
            return ["done"]
        return Launch(None, None, None, lambda: closed.append(number), watch=watch)  # type: ignore[arg-type]

    def start_round(num_proc: int, _left: float | None) -> Launch:
        started.append(num_proc)
        return launch(len(started) + 1)

    def next_size(num_proc: int) -> int:
        sizes.append(num_proc)
        return 3 - len(sizes)  # 2 ranks, then 1

    assert run_attempts(start_round, rounds, 2, first=launch(1), next_size=next_size, close_last=False) == ["done"]
    assert closed == [1, 2] and started == [2, 1] and sizes == [2, 2] and rounds.resets == 2
    assert hosts.is_blacklisted("b")


def test_a_launch_without_its_own_watch_needs_a_job_and_a_policy():
    with pytest.raises(TypeError, match="needs a job and a policy"):
        Launch(None, None, None, lambda: None)  # type: ignore[arg-type]
