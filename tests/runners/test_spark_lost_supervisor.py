"""A rank's supervisor (its Spark task's Python worker) SIGKILLed: nobody is left to say that the
rank's processes stopped, and the relaunch must not wait ``HORA_TERMINATE_GRACE`` + 5 s for that
word (every lost Python worker or executor used to pay it). On a classic session (local[2])."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

import hora.runners as hr
from hora.errors import FaultKind
from hora.runners.launchers.spark_errors import engine_failure

from .helpers import assert_no_workers_left, relaunch_lines

pytestmark = pytest.mark.spark


def _kill_supervisor_of_rank1_once():
    if os.environ["HORA_ATTEMPT"] == "1":
        if os.environ["HORA_RANK"] == "1":
            os.kill(int(os.environ["HORA_SUPERVISOR_PID"]), signal.SIGKILL)
        time.sleep(300)  # rank 1 ends when its watchdog sees its supervisor gone; rank 0 on the driver's abort
    return int(os.environ["HORA_RANK"])


def test_a_crashed_python_worker_names_its_rank():
    text = ("An error occurred while calling o479.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
            "due to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: "
            "Stage failed because barrier task ResultTask(13, 1) finished unsuccessfully.\n"
            "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting "
            "'spark.python.worker.faulthandler.enabled'")
    assert engine_failure(text) == (FaultKind.LOST, 1, "was lost: its Spark task's Python worker exited "
                                                       "unexpectedly (crashed)")


@pytest.mark.timeout(300)
def test_a_lost_supervisor_is_relaunched_without_waiting_for_its_word(spark, monkeypatch, caplog):
    # the old wait for the lost supervisor's word: HORA_TERMINATE_GRACE + 5 = 65 s
    monkeypatch.setenv("HORA_TERMINATE_GRACE", "60")
    caplog.set_level(logging.WARNING, logger="hora.runners.driver.recovery")
    t0 = time.monotonic()
    out = hr.run(_kill_supervisor_of_rank1_once, backend="spark", spark=spark, run_id="spark-lost-supervisor",
                 verbose=0, start_timeout=120, max_failures=1)
    assert out == [0, 1]
    assert time.monotonic() - t0 < 60
    (line,) = relaunch_lines(caplog)
    assert "attempt 1 of 2 failed: rank 1 on 127.0.0.1 was lost: its Spark task's Python worker exited " \
           "unexpectedly (crashed)" in line, line
    failed, relaunched = [r.created for r in caplog.records if r.name == "hora.runners.driver.recovery"][:2]
    assert relaunched - failed < 20, line  # the lost rank's silence is its word (2 s), not 65 s
    assert_no_workers_left("spark-lost-supervisor", within=30)


_EXECUTOR_LOST = ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent "
                  "failure reason: Stage failed because barrier task ResultTask(12, 1) finished unsuccessfully.\n"
                  "ExecutorLostFailure (executor 3 exited caused by one of the running tasks) Reason: Command exited "
                  "with code 137")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text, lost", [
    (_EXECUTOR_LOST, {1, 2}),  # every rank on the lost executor's host
    ("Stage failed because barrier task ResultTask(12, 2) finished unsuccessfully.\norg.apache.spark.SparkException: "
     "Python worker exited unexpectedly (crashed)", {2}),  # that task's rank only
    ("Stage failed because barrier task ResultTask(12, 1) finished unsuccessfully.\nPythonException: ZeroDivisionError",
     set()),  # a failed task: its supervisor reports as ever
])
def test_the_teardown_waits_for_the_silence_of_ranks_whose_supervisor_spark_lost(text, lost):
    import threading

    from hora.native import keys
    from hora.native.rendezvous import KVClient
    from hora.runners.driver.service import DriverService
    from hora.runners.launchers.spark import SILENT_AFTER, SparkJob

    service = DriverService(b"s" * 32, 4, "silent", verbose=0)
    rank_client = KVClient(service.addr, b"s" * 32, timeout=10.0)  # what the ranks write through
    try:
        for rank, host in enumerate(["h0", "h1", "h1", "h2"]):
            rank_client.set(keys.rank_key(keys.STARTED, rank), host.encode())
            rank_client.add(keys.rank_key(keys.HEARTBEAT, rank), 1)
        job = SparkJob.__new__(SparkJob)  # the stage itself is over: a finished thread and Spark's error
        job.service, job.spec, job._error = service, type("Spec", (), {"run_id": "silent"})(), RuntimeError(text)
        job._thread = threading.Thread(target=lambda: None)
        job._thread.start()
        job._thread.join()
        assert job._lost_supervisors() == lost
        rank_client.set(keys.rank_key(keys.EXITED, 0), b"1")
        t0 = time.monotonic()
        beating = threading.Event()

        def beat():  # rank 3 still heartbeats: its process runs
            client = KVClient(service.addr, b"s" * 32, timeout=10.0)
            try:
                while not beating.wait(0.2):
                    client.add(keys.rank_key(keys.HEARTBEAT, 3), 1)
            finally:
                client.close()

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            assert job._wait_silent({0, 1, 2} & (lost | {0}), 10) == set()  # exited or silent
            assert SILENT_AFTER <= time.monotonic() - t0 < 5 or not lost
            assert job._wait_silent({3}, 1.0) == {3}  # a rank that heartbeats is not silent
        finally:
            beating.set()
            thread.join(timeout=5)
    finally:
        rank_client.close()
        service.close()


@pytest.mark.timeout(60)
def test_a_rank_heartbeats_several_times_within_the_silence_that_counts_it_stopped():
    """The silence that proves a rank stopped (its supervisor lost) holds 4 beats of its watchdog:
    a live rank never looks silent for one late beat, and the proof comes 0.75-1 s after it died
    (was 1-2 s at one beat a second)."""
    from hora.native import keys
    from hora.native.rendezvous import KVClient
    from hora.runners.driver.service import DriverService
    from hora.runners.launchers.spark import BEAT_INTERVAL, SILENT_AFTER
    from hora.runners.rank.main import _Watchdog

    assert SILENT_AFTER >= 4 * BEAT_INTERVAL and SILENT_AFTER <= 1.0
    service = DriverService(b"s" * 32, 1, "beats", verbose=0)
    client = KVClient(service.addr, b"s" * 32, timeout=10.0)
    watchdog = _Watchdog(client, 0, None, BEAT_INTERVAL)
    try:
        watchdog.start()
        # the beats a silence of SILENT_AFTER must miss (waited for, not timed: a loaded host delays them)
        deadline = time.monotonic() + 20
        beats = 0
        while beats < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            beats = int(client.add(keys.rank_key(keys.HEARTBEAT, 0), 0))
        assert beats >= 4, beats
        assert watchdog.is_alive()  # beating between its (once a second) reads of the abort key
    finally:
        watchdog.stopped.set()
        watchdog.join(timeout=5)
        client.close()
        service.close()


def _beat_interval() -> float:
    import threading

    (watchdog,) = [t for t in threading.enumerate() if t.name == "hora-watchdog"]
    return watchdog.beat_interval


@pytest.mark.timeout(300)
def test_only_spark_ranks_beat_four_times_a_second(spark):
    """Spark's proof that a lost rank stopped is its silence, so its ranks beat every 0.25 s; the
    ranks of the other launchers beat once a second (4x fewer requests on a large job's driver)."""
    from hora.runners.launchers.spark import BEAT_INTERVAL
    from hora.runners.spec import HEARTBEAT_INTERVAL

    assert hr.run(_beat_interval, backend="spark", spark=spark, num_proc=2, run_id="spark-beats", verbose=0,
                  start_timeout=120) == [BEAT_INTERVAL] * 2
    assert hr.run(_beat_interval, backend="local", num_proc=2, run_id="local-beats", verbose=0) == \
        [HEARTBEAT_INTERVAL] * 2


@pytest.mark.timeout(60)
def test_a_watchdog_beats_no_faster_than_its_interval_while_it_checks_its_supervisor_more_often():
    """Beats come every ``beat_interval`` (here 0.5 s), not every supervisor check (0.25 s): the
    time between the first and the third beat seen is at least two intervals, less the polling
    slack (a loaded host only makes it longer). The supervisor check still ends the rank."""
    import subprocess
    import sys
    import textwrap

    from hora.native import keys
    from hora.native.rendezvous import KVClient
    from hora.runners.driver.service import DriverService
    from hora.runners.rank.main import _Watchdog

    service = DriverService(b"s" * 32, 1, "slow-beats", verbose=0)
    client = KVClient(service.addr, b"s" * 32, timeout=10.0)
    watchdog = _Watchdog(client, 0, None, 0.5)
    try:
        watchdog.start()
        seen: dict[int, float] = {}
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            beats = int(client.add(keys.rank_key(keys.HEARTBEAT, 0), 0))
            if beats >= 1 and beats not in seen and beats <= 3:
                seen[beats] = time.monotonic()
            time.sleep(0.02)
        assert sorted(seen) == [1, 2, 3], seen
        assert seen[3] - seen[1] >= 2 * 0.5 - 0.1, seen
    finally:
        watchdog.stopped.set()
        watchdog.join(timeout=5)
        client.close()
        service.close()
    # a rank whose supervisor is gone exits at the next supervisor check, whatever its beat interval
    code = textwrap.dedent(f"""
        import os, sys, time
        from hora.native.rendezvous import KVClient
        from hora.runners.driver.service import DriverService
        from hora.runners.rank.main import _Watchdog
        service = DriverService(b"s" * 32, 1, "orphan", verbose=0)
        dog = _Watchdog(KVClient(service.addr, b"s" * 32, timeout=10.0), 0, 2**22 + 7, 1.0)  # no such pid
        dog.start()
        time.sleep(30)
        sys.exit(0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45)
    assert proc.returncode != 0 and "its supervisor (pid 4194311) is gone" in proc.stderr, proc.stderr[-2000:]
