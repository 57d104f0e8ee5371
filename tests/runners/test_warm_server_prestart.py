"""A Spark fit's prestart job (the job that starts the executors' warm rank servers while the fit
materializes its data) is cancelled when the training stage is submitted if it has not ended: one
still waiting for task slots would otherwise wait out the whole training stage and take the freed
cores first when a lost rank's relaunch needs them (issue 29)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import hora.runners as hr
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


@pytest.mark.timeout(180)
def test_a_training_stage_cancels_a_prestart_job_still_waiting_for_slots(spark, tmp_path, caplog):
    release = str(tmp_path / "release")

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

    caplog.set_level(logging.DEBUG, logger="hora.runners.launchers.spark")
    holder = threading.Thread(target=lambda: spark.range(0, 2, 1, numPartitions=2).mapInArrow(hold, "x long").collect())
    holder.start()
    results: list = []
    runner = None
    try:
        _until(lambda: _active_tasks(spark) == 2, 60, "the holding job took both slots of local[2]")
        launcher = hr.SparkLauncher(spark)
        stages = len(spark.sparkContext.statusTracker().getActiveStageIds())
        launcher.prestart(2, {})
        _until(lambda: len(spark.sparkContext.statusTracker().getActiveStageIds()) > stages, 30,
               "the prestart job was submitted")
        runner = threading.Thread(target=lambda: results.append(
            hr.run(lambda: 7, num_proc=2, backend=launcher, run_id="prestart-cancel", verbose=0)))
        runner.start()
        _until(lambda: CANCELLED in caplog.text, 60, "the training stage cancelled the waiting prestart job")
    finally:
        open(release, "w").close()
        holder.join(timeout=60)
        if runner is not None:
            runner.join(timeout=120)
    assert results == [[7, 7]]
    _until(lambda: "could not start the warm rank servers ahead of the ranks" in caplog.text, 30,
           "the prestart job ended, cancelled")
    assert not spark_launcher._prestarts.get(spark_launcher._spark.session_key(spark))
