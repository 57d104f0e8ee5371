"""Fixtures of the runner tests: one SparkSession local[2] and one Dask LocalCluster per session."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark_event_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("spark-events")


@pytest.fixture(scope="session")
def spark(spark_event_dir):
    pyspark = pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hora-runner-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", "file://" + str(spark_event_dir))
        .config("spark.eventLog.compress", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    assert pyspark.__version__
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dask_client():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=":0", silence_logs=40,
    )
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()
