"""hora.runners.run on a real SparkSession local[2] (one barrier stage per run)."""

from __future__ import annotations

import glob
import os
import sys
import signal
import time

import pytest

import hora.runners as hr
from hora.errors import ConfigError, WorkerFailedError
from hora.runners import base

from .helpers import assert_no_workers_left

pytestmark = pytest.mark.spark


def _allreduce_env():
    import numpy as np

    import hora.native as hn

    out = hn.allreduce(np.array([float(hn.rank() + 1)]), op=hn.Sum, name="spark.sum")
    print(f"rank {hn.rank()} sum {out[0]}", flush=True)
    keys = ["HORA_RANK", "HORA_LOCAL_RANK", "HORA_LOCAL_SIZE", "HORA_HOSTNAME", "HORA_RENDEZVOUS_ADDR"]
    return float(out[0]), {k: os.environ[k] for k in keys}


@pytest.mark.timeout(240)
def test_spark_results_in_rank_order_and_secret_not_in_the_ui(spark, spark_event_dir, monkeypatch, capfd):
    secret = bytes(range(7, 39))
    monkeypatch.setattr(base, "make_secret", lambda: secret)
    results = hr.run(_allreduce_env, backend="spark", spark=spark, run_id="spark-ok", verbose=1)
    assert len(results) == spark.sparkContext.defaultParallelism == 2
    assert [r[0] for r in results] == [3.0, 3.0]
    envs = [r[1] for r in results]
    assert [e["HORA_RANK"] for e in envs] == ["0", "1"]
    assert [e["HORA_LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["HORA_LOCAL_SIZE"] for e in envs} == {"2"}
    assert {e["HORA_HOSTNAME"] for e in envs} == {"127.0.0.1"}
    assert len({e["HORA_RENDEZVOUS_ADDR"] for e in envs}) == 1  # rank 0's server, shared by allGather
    out, err = capfd.readouterr()
    assert "[1]<stdout>:rank 1 sum 3.0" in out
    # the Spark UI's data (job description, properties) is in the event log
    text = ""
    for path in glob.glob(os.path.join(str(spark_event_dir), "**"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                text += fh.read().decode("utf-8", "replace")
    assert "hora: train spark-ok" in text
    assert "hora-spark-ok" in text  # the job group
    for shown in (secret.hex(), repr(secret), secret.hex().upper()):
        assert shown not in text
    assert secret.hex() not in out + err
    assert_no_workers_left("spark-ok")


def _fail_rank1():
    if os.environ["HORA_RANK"] == "1":
        raise ZeroDivisionError("spark rank 1 divides by zero")
    time.sleep(120)


@pytest.mark.timeout(180)
def test_spark_failure_raises_with_traceback_and_cancels_the_job(spark):
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_fail_rank1, backend="spark", spark=spark, run_id="spark-fail", verbose=0, start_timeout=120)
    assert info.value.rank == 1
    assert "spark rank 1 divides by zero" in info.value.remote_traceback
    assert "_fail_rank1" in info.value.remote_traceback
    tracker = spark.sparkContext.statusTracker()
    for job_id in tracker.getJobIdsForGroup("hora-spark-fail"):
        assert tracker.getJobInfo(job_id).status != "RUNNING"
    assert_no_workers_left("spark-fail")


def _sigkill_rank1():
    if os.environ["HORA_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)


@pytest.mark.timeout(180)
def test_spark_rank_killed_with_sigkill(spark):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_sigkill_rank1, backend="spark", spark=spark, run_id="spark-kill", verbose=0, start_timeout=120)
    assert time.monotonic() - t0 < 60
    assert info.value.rank == 1
    assert "SIGKILL" in str(info.value)
    assert_no_workers_left("spark-kill")


def test_spark_more_ranks_than_slots_fails_at_once(spark):
    with pytest.raises(ConfigError, match=r"num_proc=3 needs 3 task slots .* has 2"):
        hr.run(_fail_rank1, num_proc=3, backend="spark", spark=spark, run_id="spark-toomany")
    assert spark.sparkContext.statusTracker().getJobIdsForGroup("hora-spark-toomany") == []


def test_spark_slots_from_master():
    from hora.runners.spark import SparkLauncher

    class _Conf:
        def __init__(self, cpus):
            self.cpus = cpus

        def get(self, key, default=None):
            return self.cpus if key == "spark.task.cpus" else default

    class _SC:
        def __init__(self, master, cpus="1"):
            self.master = master
            self._conf = _Conf(cpus)
            self.defaultParallelism = 7

        def getConf(self):
            return self._conf

    class _Session:
        def __init__(self, sc):
            self.sparkContext = sc

    def slots(master, cpus="1"):
        return SparkLauncher(_Session(_SC(master, cpus))).slots()

    assert slots("local") == 1
    assert slots("local[4]") == 4
    assert slots("local[4, 2]") == 4
    assert slots("local[4]", cpus="2") == 2
    assert slots("local[*]") == (os.cpu_count() or 1)
    assert slots("local-cluster[2, 3, 1024]") == 6
    assert slots("spark://host:7077") == 7


@pytest.mark.timeout(180)
def test_spark_keyboard_interrupt_cancels_the_job(spark, tmp_path):
    from .helpers import interrupt_when_files_exist, touch_and_sleep

    interrupt_when_files_exist([str(tmp_path / "in-fn.0"), str(tmp_path / "in-fn.1")])
    with pytest.raises(KeyboardInterrupt):
        hr.run(touch_and_sleep, args=(str(tmp_path),), backend="spark", spark=spark, run_id="spark-ctrl-c", verbose=0)
    tracker = spark.sparkContext.statusTracker()
    job_ids = tracker.getJobIdsForGroup("hora-spark-ctrl-c")
    assert job_ids
    for job_id in job_ids:
        assert tracker.getJobInfo(job_id).status != "RUNNING"
    assert_no_workers_left("spark-ctrl-c")


def _horovod_spark_fn(offset):
    import torch

    import hora.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="n")
    print(f"spark rank {hvd.rank()} says hello", flush=True)
    return hvd.rank() + offset, float(total[0])


@pytest.mark.timeout(240)
def test_hora_spark_run_is_horovods_spark_run(spark):
    import io

    import hora.spark

    out = io.StringIO()
    assert hora.spark.run(_horovod_spark_fn, args=(10,), num_proc=2, stdout=out,
                          prefix_output_with_timestamp=True) == [(10, 2.0), (11, 2.0)]
    lines = out.getvalue().splitlines()
    assert any(line.endswith("[1]<stdout>:spark rank 1 says hello") and line[0].isalpha() for line in lines), lines
    with pytest.raises(ConfigError, match="use_mpi / extra_mpi_args are not supported"):
        hora.spark.run(_horovod_spark_fn, args=(0,), use_mpi=True)
    assert_no_workers_left(f"{sys.executable} -m hora.runners.worker")  # this checkout's workers only
