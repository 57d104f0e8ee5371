"""A rank's supervisor (its Spark task's Python worker) SIGKILLed: nobody is left to say that the
rank's processes stopped, and the relaunch must not wait ``HORA_TERMINATE_GRACE`` + 5 s for that
word (issue 29: every lost Python worker or executor paid it). On a classic session (local[2])."""

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
