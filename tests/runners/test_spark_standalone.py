"""The training stage's ResourceProfile on a real Spark standalone cluster: a master and two
2-core workers on 127.0.0.1 and 127.0.0.2 (each its own executor JVM), driven through a
Spark Connect server whose master is that cluster."""

from __future__ import annotations

import json
import os

import pytest

import hora.runners as hr
from hora.errors import ConfigError

from .helpers import assert_no_workers_left
from .test_spark import tagged_job_results

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _where():
    import numpy as np

    import hora.native as hn

    out = hn.allreduce(np.array([1.0, float(hn.rank())]), op=hn.Sum, name="standalone.sum")
    keys = ["HORA_HOSTNAME", "HORA_LOCAL_RANK", "HORA_LOCAL_SIZE", "HORA_CROSS_RANK", "HORA_CROSS_SIZE"]
    return out.tolist(), {k: os.environ[k] for k in keys}


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.timeout(420)
def test_profile_stage_runs_one_two_cpu_task_per_worker(standalone_connect):
    server, spark = standalone_connect
    launcher = hr.SparkLauncher(spark, task_cpus=2)
    assert launcher.connect and launcher.master.startswith("spark://")
    assert launcher.slots() == 2  # 2 workers x 2 cores, 2 CPUs per training task
    results = hr.run(_where, num_proc=2, backend=launcher, run_id="standalone-profile", verbose=0, start_timeout=180)
    assert [r[0] for r in results] == [[2.0, 1.0], [2.0, 1.0]]
    envs = [r[1] for r in results]
    # 2-CPU tasks on 2-core executors: one per worker, so the two ranks sit on the two hosts
    assert sorted(e["HORA_HOSTNAME"] for e in envs) == ["127.0.0.1", "127.0.0.2"]
    assert {e["HORA_LOCAL_SIZE"] for e in envs} == {"1"} and {e["HORA_CROSS_SIZE"] for e in envs} == {"2"}
    assert_no_workers_left("standalone-profile")

    # the stage really ran with the task profile: 2 CPUs per task, not the default 1
    events = _events(server.event_log_text())
    profiles = {
        e["Resource Profile Id"]: e["Task Resource Requests"]
        for e in events if e["Event"] == "SparkListenerResourceProfileAdded"
    }
    job = next(e for e in events if e["Event"] == "SparkListenerJobStart"
               and "hora-train-standalone-profile" in e["Properties"].get("spark.job.tags", ""))
    stage_profile = job["Stage Infos"][0]["Resource Profile Id"]
    assert stage_profile != 0 and profiles[stage_profile]["cpus"]["Amount"] == 2.0

    # more ranks than the profile's slots: refused before any job starts
    with pytest.raises(ConfigError, match=r"num_proc=3 needs 3 task slots .* with 2 CPU\(s\) each.* has 2"):
        hr.run(_where, num_proc=3, backend=launcher, run_id="standalone-toomany")
    assert tagged_job_results(server.event_log_text(), "hora-train-standalone-toomany") == []


@pytest.mark.timeout(300)
def test_gpu_profile_on_a_cluster_without_gpus_is_a_clear_error(standalone_connect):
    server, spark = standalone_connect
    launcher = hr.SparkLauncher(spark, use_gpu=True)
    # the CPU slots would fit; Spark refuses a GPU profile on executors that declare no GPUs
    with pytest.raises(ConfigError, match=r"use_gpu=True .* executors of this Spark cluster .* declare no GPUs"):
        hr.run(_where, num_proc=2, backend=launcher, run_id="standalone-gpu", verbose=0, start_timeout=120)
    assert tagged_job_results(server.event_log_text(), "hora-train-standalone-gpu") == []  # refused at planning
    assert_no_workers_left("standalone-gpu")
