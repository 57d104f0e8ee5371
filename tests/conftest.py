"""Test-wide settings and the engines shared by every test directory.

One SparkSession (``local[2]``) and one Dask ``LocalCluster`` (2 worker processes) are
started lazily, once per test run, and shared by the store, runner, estimator and
Keras tests: warming them once keeps the suite fast on 2 cores, and one definition
keeps their settings consistent (everything binds to loopback).
"""

from __future__ import annotations

import os
import sys

import pytest

# Spark Connect server, standalone cluster and the classic/Connect parametrization (tests/spark_clusters.py)
from .spark_clusters import any_spark, connect_server, connect_spark, standalone_cluster, standalone_connect  # noqa: F401

# Workers spawned by tests inherit these: one thread per rank on a 2-core machine,
# Spark's Python workers run this interpreter, everything stays on loopback, TF is quiet.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# Every Spark JVM of the run (drivers, executors: tests/spark_conf/spark-defaults.conf; the standalone
# master and workers: SPARK_DAEMON_JAVA_OPTS) compiles with C1 only and collects serially: half the JVM
# CPU for the short jobs of a test, on 2 cores shared by two test processes.
os.environ.setdefault("SPARK_CONF_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_conf"))
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def spark_event_dir(tmp_path_factory):
    """Where the shared SparkSession writes its event log (tests read it to audit the UI data)."""
    return tmp_path_factory.mktemp("spark-events")


@pytest.fixture(scope="session")
def spark(spark_event_dir):
    """The one SparkSession of the run: local[2], UI off, loopback only, event log on."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("hora-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", "file://" + str(spark_event_dir))
        .config("spark.eventLog.compress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dask_client():
    """The one Dask LocalCluster of the run (2 worker processes, 1 thread each) and its Client."""
    pytest.importorskip("distributed")
    import dask
    from distributed import Client, LocalCluster

    # Tests kill its workers (their nannies start new ones): a LocalCluster closes a nanny for good
    # when no worker of its name is back `lost-worker-timeout` (15 s) after a removal, and the check
    # of an earlier removal also fires during a later restart of the same name.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=":0", silence_logs=40,
        )
        client = Client(cluster)
        yield client
        client.close()
        cluster.close()


@pytest.fixture(autouse=True)
def _no_job_left_initialized(request):
    """A test that leaves a hora job initialized in the test process fails here, by name, and the
    job is shut down: the next test in the same process (xdist runs several files per process, in
    an order that changes with the run) would otherwise find ``init()`` a no-op and fail for it."""
    yield
    native = sys.modules.get("hora.native")
    if native is None or not native.is_initialized():
        return
    native.shutdown()
    pytest.fail(f"{request.node.nodeid} left a hora job initialized in the test process "
                "(pair every init() with shutdown(), e.g. tests.single_rank.one_rank_job)", pytrace=False)
