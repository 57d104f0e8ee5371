"""A Spark fit's prestart job (the job that starts the executors' warm rank servers while the fit
materializes its data) is cancelled by the training stage only while none of its tasks has
begun: one still waiting for task slots would otherwise wait out the whole training stage and
take the freed cores first when a lost rank's relaunch needs them (issue 29); one whose tasks
run is left alone (cancelling it killed the Python worker starting a warm server)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import hora.runners as hr
from hora import _spark
from hora.runners.launchers import spark as spark_launcher

pytestmark = pytest.mark.spark

CANCELLED = "cancelled the prestart job"


def _active_tasks(session) -> int:
    tracker = session.sparkContext.statusTracker()
    return sum(info.numActiveTasks for info in map(tracker.getStageInfo, tracker.getActiveStageIds()) if info)


def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:g}s"
        time.sleep(0.05)


def _holder(spark, release: str, tag: str, out: list):
    def hold(batches):  # holds a task slot until `release` exists (at most a minute)
        import os
        import time

        import pyarrow as pa

        for _ in batches:
            pass
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield pa.RecordBatch.from_pydict({"x": pa.array([1], pa.int64())})

    def run():
        try:
            with _spark.job_scope(spark, tag, "test: hold both slots"):
                out.append(len(spark.range(0, 2, 1, numPartitions=2).mapInArrow(hold, "x long").collect()))
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.timeout(180)
def test_a_training_stage_cancels_a_prestart_job_whose_tasks_never_began_not_one_whose_tasks_run(spark, tmp_path, caplog):
    release = str(tmp_path / "release")
    caplog.set_level(logging.DEBUG, logger="hora.runners.launchers.spark")
    held: list = []
    holder = _holder(spark, release, "test-hold-slots", held)
    session = _spark.session_key(spark)
    results: list = []
    runner = None
    try:
        _until(lambda: _active_tasks(spark) == 2, 60, "the holding job took both slots of local[2]")
        # a job whose tasks run, registered as a prestart job: never cancelled
        with spark_launcher._prestarts_lock:
            spark_launcher._prestarts.setdefault(session, set()).add("test-hold-slots")
        assert spark_launcher._tasks_begun(spark, "test-hold-slots") is True
        spark_launcher._cancel_pending_prestarts(spark, "prestart-pending")
        launcher = hr.SparkLauncher(spark)
        stages = len(spark.sparkContext.statusTracker().getActiveStageIds())
        launcher.prestart(2, {})
        _until(lambda: len(spark.sparkContext.statusTracker().getActiveStageIds()) > stages, 30,
               "the prestart job was submitted")
        pending = sorted(spark_launcher._prestarts[session] - {"test-hold-slots"})
        assert len(pending) == 1 and spark_launcher._tasks_begun(spark, pending[0]) is False
        runner = threading.Thread(target=lambda: results.append(
            hr.run(lambda: 7, num_proc=2, backend=launcher, run_id="prestart-pending", verbose=0)))
        runner.start()
        _until(lambda: CANCELLED in caplog.text, 60, "the training stage cancelled the waiting prestart job")
        assert f"{CANCELLED} {pending[0]}" in caplog.text and f"{CANCELLED} test-hold-slots" not in caplog.text
    finally:
        open(release, "w").close()
        holder.join(timeout=60)
        with spark_launcher._prestarts_lock:
            left = spark_launcher._prestarts.get(session, set())
            left.discard("test-hold-slots")
            if not left:
                spark_launcher._prestarts.pop(session, None)
        if runner is not None:
            runner.join(timeout=120)
    assert held == [2]  # the job whose tasks ran was not cancelled
    assert results == [[7, 7]]
    _until(lambda: "could not start the warm rank servers ahead of the ranks" in caplog.text, 30,
           "the prestart job ended, cancelled")
    assert not spark_launcher._prestarts.get(session)
