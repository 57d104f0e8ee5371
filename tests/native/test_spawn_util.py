"""What the collective tests rely on in tests/spawn_util.run_ranks: ranks forked from the
warm server get the caller's environment of the moment (not the server's), a failing or
dying rank is reported, a server holds exactly the modules its call asked for, and the
session's pool of 2 warm ranks (tests/rank_pool.py) serves one call after another only
while no call failed or left anything behind."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from hora.errors import WorkerFailedError
from tests import rank_pool
from tests.spawn_util import run_ranks

_PROBE = "xml.dom.minidom"  # imported by nothing else here: its presence means the server preloaded it


def _environment() -> dict:
    return {"only_parent": os.environ.get("HORA_TEST_SPAWN_UTIL"), "per_rank": os.environ.get("HORA_TEST_PER_RANK"),
            "rank": os.environ["HORA_RANK"], "torch": "torch" in sys.modules, "probe": _PROBE in sys.modules}


def _fail(how: str) -> None:
    if os.environ["HORA_RANK"] == "1":
        if how == "raise":
            raise ValueError("rank 1 fails on purpose")
        os._exit(3)


def test_ranks_see_the_callers_environment_of_the_moment(monkeypatch):
    monkeypatch.setenv("HORA_TEST_SPAWN_UTIL", "set")
    first = run_ranks(_environment, 2, rank_env={1: {"HORA_TEST_PER_RANK": "one"}}, timeout=60)
    assert [(o["rank"], o["only_parent"], o["per_rank"]) for o in first] == [("0", "set", None), ("1", "set", "one")]
    assert all(o["torch"] for o in first)  # forked from the warm server
    monkeypatch.delenv("HORA_TEST_SPAWN_UTIL")
    assert run_ranks(_environment, 1, timeout=60)[0]["only_parent"] is None


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "own ranks"])
@pytest.mark.parametrize("how, message", [("raise", "rank 1 raised ValueError"), ("exit", "rank 1 died with exit code 3")])
def test_a_failing_rank_is_reported(how, message, pool):
    with pytest.raises(WorkerFailedError, match=message):
        run_ranks(_fail, 2, args=(how,), timeout=60, pool=pool)


def test_a_server_holds_exactly_the_modules_its_call_asked_for():
    assert [o["probe"] for o in run_ranks(_environment, 2, preload=(_PROBE,), timeout=60)] == [True, True]
    assert [o["probe"] for o in run_ranks(_environment, 2, timeout=60)] == [False, False]
    assert run_ranks(_environment, 1, fresh=True, timeout=60)[0]["probe"] is False


# ---------------------------------------------------------------------------- the pool
needs_pool = pytest.mark.skipif(not rank_pool.enabled(), reason="the rank pool is off (TESTS_RANK_POOL=0)")


def _pid() -> int:
    return os.getpid()


def _pid_and_variable() -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("HORA_TEST_SPAWN_UTIL")


def _leave(what: str) -> int:
    if what == "hora initialized":
        import hora.native as hn

        hn.init()
    elif what == "a thread":
        threading.Thread(target=time.sleep, args=(60,), daemon=True, name="left-behind").start()
    elif what == "a signal handler":
        signal.signal(signal.SIGUSR2, lambda *_: None)
    elif what == "a descriptor":
        os.open(os.devnull, os.O_RDONLY)
    return os.getpid()


def _slow_rank_1(seconds: float) -> int:
    if os.environ["HORA_RANK"] == "1":
        time.sleep(seconds)
    return os.getpid()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@needs_pool
def test_two_calls_are_served_by_the_same_two_pool_ranks():
    first = run_ranks(_pid, 2, timeout=60)
    assert first == rank_pool.pids() and first[0] != first[1] and os.getpid() not in first
    assert run_ranks(_pid, 2, timeout=60) == first
    # a call that asks for its own ranks does not take (nor retire) the pool's
    own = run_ranks(_pid, 2, timeout=60, pool=False)
    assert not set(own) & set(first) and rank_pool.pids() == first


@needs_pool
def test_a_call_that_raises_retires_the_pool():
    first = run_ranks(_pid, 2, timeout=60)
    with pytest.raises(WorkerFailedError, match="rank 1 raised ValueError"):
        run_ranks(_fail, 2, args=("raise",), timeout=60)
    assert rank_pool.pids() == [] and all(_gone(p) for p in first)
    again = run_ranks(_pid, 2, timeout=60)
    assert not set(again) & set(first)


@needs_pool
@pytest.mark.parametrize("what", ["hora initialized", "a thread", "a signal handler", "a descriptor"])
def test_a_call_that_leaves_state_behind_is_not_reused(what):
    run_ranks(_pid, 2, timeout=60)  # not the processes' first call (which may open descriptors for good)
    used = run_ranks(_leave, 2, args=(what,), timeout=60)
    assert rank_pool.pids() == [] and all(_gone(p) for p in used)
    assert not set(run_ranks(_pid, 2, timeout=60)) & set(used)


@needs_pool
def test_a_variable_removed_from_the_callers_environment_is_absent_in_the_next_call(monkeypatch):
    monkeypatch.setenv("HORA_TEST_SPAWN_UTIL", "set")
    first = run_ranks(_pid_and_variable, 2, timeout=60)
    assert [v for _, v in first] == ["set", "set"]
    monkeypatch.delenv("HORA_TEST_SPAWN_UTIL")
    second = run_ranks(_pid_and_variable, 2, timeout=60)
    assert second == [(pid, None) for pid, _ in first]  # the same processes


@needs_pool
def test_a_timeout_kills_both_pool_ranks_and_names_the_one_that_never_finished():
    before = run_ranks(_pid, 2, timeout=60)
    with pytest.raises(WorkerFailedError, match=r"ranks \[1\] did not finish within 2s"):
        run_ranks(_slow_rank_1, 2, args=(60.0,), timeout=2)
    assert rank_pool.pids() == [] and all(_gone(p) for p in before)


@needs_pool
def test_a_pool_rank_that_died_between_calls_is_replaced_before_the_next_call():
    first = run_ranks(_pid, 2, timeout=60)
    os.kill(first[1], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(first[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = run_ranks(_pid, 2, timeout=60)
    assert not set(again) & set(first) and _gone(first[0])
