"""hora.runners.run on Spark: one barrier stage per run, on a classic session (local[2]) and on a
Spark Connect session (a real Connect server, local[2]), with the same assertions."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import hora.runners as hr
from hora import _spark
from hora.errors import ConfigError, RankError, RankKilledError, WorkerFailedError
from hora.runners import api as base

from .helpers import assert_no_workers_left, interrupt_when_files_exist, touch_and_sleep
from .scoped import assert_no_ranks_left_since

pytestmark = pytest.mark.spark


def _kind(session) -> str:
    return "connect" if _spark.is_connect(session) else "classic"


def event_log(session, request) -> str:
    """The event log of the application behind ``session`` (what its Spark UI shows)."""
    if _spark.is_connect(session):
        return request.getfixturevalue("connect_server").event_log_text()
    text = ""
    for root, _, files in os.walk(str(request.getfixturevalue("spark_event_dir"))):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                text += fh.read().decode("utf-8", "replace")
    return text


def tagged_job_results(text: str, tag: str) -> list[str]:
    """The results (JobSucceeded / JobFailed) of the jobs whose tags include ``tag``, from an event log."""
    started, ended = [], {}
    for line in text.splitlines():
        if '"SparkListenerJob' not in line:
            continue
        event = json.loads(line)
        if event["Event"] == "SparkListenerJobStart":
            if tag in (event.get("Properties") or {}).get("spark.job.tags", ""):
                started.append(event["Job ID"])
        elif event["Event"] == "SparkListenerJobEnd":
            ended[event["Job ID"]] = event["Job Result"]["Result"]
    return [ended.get(job, "running") for job in started]


def wait_for_job_results(session, request, tag: str, timeout: float = 60.0) -> list[str]:
    """The results of the jobs tagged ``tag`` once none is running any more."""
    deadline = time.monotonic() + timeout
    while True:
        results = tagged_job_results(event_log(session, request), tag)
        if results and "running" not in results:
            return results
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs tagged {tag} still running (or never started): {results}")
        time.sleep(0.5)


def _allreduce_env():
    import numpy as np

    import hora.native as hn

    out = hn.allreduce(np.array([float(hn.rank() + 1)]), op=hn.Sum, name="spark.sum")
    print(f"rank {hn.rank()} sum {out[0]}", flush=True)
    keys = ["HORA_RANK", "HORA_LOCAL_RANK", "HORA_LOCAL_SIZE", "HORA_HOSTNAME", "HORA_RENDEZVOUS_ADDR"]
    return float(out[0]), {k: os.environ[k] for k in keys}, b"x" * (3 << 20)  # a value of several result chunks


@pytest.mark.timeout(300)
def test_run_in_rank_order_names_the_run_and_hides_the_secret(any_spark, request, monkeypatch, capfd):
    kind = _kind(any_spark)
    secret = bytes(range(7, 39))
    monkeypatch.setattr(base, "make_secret", lambda: secret)
    run_id = f"spark-ok-{kind}"
    results = hr.run(_allreduce_env, backend="spark", spark=any_spark, run_id=run_id, verbose=1)
    assert len(results) == 2  # the default: the session's slots (local[2])
    assert [r[0] for r in results] == [3.0, 3.0]
    assert all(r[2] == b"x" * (3 << 20) for r in results)
    envs = [r[1] for r in results]
    assert [e["HORA_RANK"] for e in envs] == ["0", "1"]
    assert [e["HORA_LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["HORA_LOCAL_SIZE"] for e in envs} == {"2"}
    assert {e["HORA_HOSTNAME"] for e in envs} == {"127.0.0.1"}
    assert len({e["HORA_RENDEZVOUS_ADDR"] for e in envs}) == 1  # rank 0's server, shared by allGather
    out, err = capfd.readouterr()
    assert "[1]<stdout>:rank 1 sum 3.0" in out
    # the Spark UI's data: the stage's function is named after the run, its job carries the run's tag
    assert wait_for_job_results(any_spark, request, f"hora-train-{run_id}") == ["JobSucceeded"]
    text = event_log(any_spark, request)
    assert f"hora: train {run_id}" in text
    if kind == "classic":
        assert f'"spark.job.description":"hora: train {run_id}"' in text
    for shown in (secret.hex(), repr(secret), secret.hex().upper()):
        assert shown not in text
    assert secret.hex() not in out + err
    assert_no_workers_left(run_id)


def _fail_rank1():
    if os.environ["HORA_RANK"] == "1":
        raise ZeroDivisionError("spark rank 1 divides by zero")
    time.sleep(120)


@pytest.mark.timeout(240)
def test_failure_names_the_rank_with_its_traceback_and_cancels_the_job(any_spark, request):
    run_id = f"spark-fail-{_kind(any_spark)}"
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_fail_rank1, backend="spark", spark=any_spark, run_id=run_id, verbose=0, start_timeout=120)
    assert time.monotonic() - t0 < 100  # not the 120 s that rank 0 sleeps
    assert type(info.value) is RankError
    assert info.value.rank == 1
    assert "spark rank 1 divides by zero" in info.value.remote_traceback
    assert "_fail_rank1" in info.value.remote_traceback
    assert wait_for_job_results(any_spark, request, f"hora-train-{run_id}") == ["JobFailed"]
    assert_no_workers_left(run_id)


def _sigkill_rank1():
    if os.environ["HORA_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)


@pytest.mark.timeout(180)
def test_rank_killed_with_sigkill(connect_spark):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_sigkill_rank1, backend="spark", spark=connect_spark, run_id="spark-kill", verbose=0, start_timeout=120)
    assert time.monotonic() - t0 < 100
    assert type(info.value) is RankKilledError
    assert info.value.rank == 1
    assert "SIGKILL" in str(info.value)
    assert_no_workers_left("spark-kill")


@pytest.mark.timeout(120)
def test_more_ranks_than_slots_fails_before_any_job(any_spark, request):
    run_id = f"spark-toomany-{_kind(any_spark)}"
    with pytest.raises(ConfigError, match=r"num_proc=3 needs 3 task slots .* has 2"):
        hr.run(_fail_rank1, num_proc=3, backend="spark", spark=any_spark, run_id=run_id)
    with pytest.raises(ConfigError, match=r"num_proc=2 needs 2 task slots .* with 2 CPU\(s\) each.* has 1"):
        hr.run(_fail_rank1, num_proc=2, backend=hr.SparkLauncher(any_spark, task_cpus=2), run_id=run_id)
    assert tagged_job_results(event_log(any_spark, request), f"hora-train-{run_id}") == []


@pytest.mark.timeout(240)
def test_keyboard_interrupt_cancels_the_job_by_its_tag(any_spark, request, tmp_path):
    run_id = f"spark-ctrl-c-{_kind(any_spark)}"
    interrupt_when_files_exist([str(tmp_path / "in-fn.0"), str(tmp_path / "in-fn.1")])
    with pytest.raises(KeyboardInterrupt):
        hr.run(touch_and_sleep, args=(str(tmp_path),), backend="spark", spark=any_spark, run_id=run_id, verbose=0)
    assert wait_for_job_results(any_spark, request, f"hora-train-{run_id}") == ["JobFailed"]
    assert_no_workers_left(run_id)


def test_launcher_finds_the_active_session_and_checks_its_arguments(spark):
    launcher = hr.SparkLauncher()
    assert launcher.spark is spark and not launcher.connect and launcher.slots() == 2
    assert hr.SparkLauncher(spark, task_cpus=2).slots() == 1
    assert launcher.profile() is None and hr.SparkLauncher(spark, task_cpus=2).profile() is None  # local master
    with pytest.raises(ConfigError, match="task_cpus must be an int >= 1"):
        hr.SparkLauncher(spark, task_cpus=0)
    with pytest.raises(ConfigError, match="use_gpu must be True or False"):
        hr.SparkLauncher(spark, use_gpu="yes")


def test_slots_from_master():
    from hora.runners.launchers.spark import SparkLauncher

    class _Conf:
        def __init__(self, values):
            self.values = values

        def get(self, key, default=None):
            return self.values.get(key, default)

    class _SC:
        defaultParallelism = 7

        def __init__(self, master):
            self.master = master

    class _Session:
        def __init__(self, master, cpus):
            self.sparkContext = _SC(master)
            self.conf = _Conf({"spark.task.cpus": cpus})

    def slots(master, cpus="1", **kwargs):
        return SparkLauncher(_Session(master, cpus), **kwargs).slots()

    assert slots("local") == 1
    assert slots("local[4]") == 4
    assert slots("local[4, 2]") == 4
    assert slots("local[4]", cpus="2") == 2
    assert slots("local[4]", task_cpus=3) == 1
    assert slots("local[*]") == (os.cpu_count() or 1)
    assert slots("local-cluster[2, 3, 1024]") == 6
    assert slots("local-cluster[2, 3, 1024]", task_cpus=2) == 2
    assert slots("spark://host:7077") == 7
    assert slots("spark://host:7077", task_cpus=2) == 3


@pytest.mark.timeout(240)
def test_connect_server_whose_executors_lack_hora_is_a_clear_client_side_error(connect_server, tmp_path):
    import pandas as pd

    from hora.store import Store, materialize
    from tests.spark_clusters import python_without_hora

    # a session whose executors run a Python that cannot import hora (as on a cluster without it)
    session = connect_server.session(**{"spark.sql.execution.pyspark.python": python_without_hora(tmp_path)})
    try:
        with pytest.raises(ConfigError, match=r"the Spark executors cannot import hora .*No module named 'hora'"):
            hr.run(_fail_rank1, num_proc=2, backend="spark", spark=session, run_id="connect-no-hora", verbose=0)
        df = session.createDataFrame(pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0]}))
        with pytest.raises(ConfigError, match=r"the Spark executors cannot import hora"):
            materialize(df, Store.create(str(tmp_path / "store")), ["x"], ["y"])
    finally:
        session.stop()
    assert_no_workers_left("connect-no-hora")


def test_a_connect_server_older_than_spark_4_is_refused_before_anything_runs():
    class _OldConnectSession:  # what a Spark 3.5 Connect server reports to a client
        version = "3.5.3"

    _OldConnectSession.__module__ = "pyspark.sql.connect.session"
    assert _spark.is_connect(_OldConnectSession())
    with pytest.raises(ConfigError, match=r"Spark Connect server runs Spark 3\.5\.3; .* from Spark 4\.0 on"):
        hr.SparkLauncher(_OldConnectSession())


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

    t0 = time.time()
    out = io.StringIO()
    assert hora.spark.run(_horovod_spark_fn, args=(10,), num_proc=2, stdout=out,
                          prefix_output_with_timestamp=True) == [(10, 2.0), (11, 2.0)]
    lines = out.getvalue().splitlines()
    assert any(line.endswith("[1]<stdout>:spark rank 1 says hello") and line[0].isalpha() for line in lines), lines
    with pytest.raises(ConfigError, match="use_mpi / extra_mpi_args are not supported"):
        hora.spark.run(_horovod_spark_fn, args=(0,), use_mpi=True)
    assert_no_ranks_left_since(t0)
