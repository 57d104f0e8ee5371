"""Fixtures of the TensorFlow/Keras tests: quiet TensorFlow, a size-1 hora job in-process."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

pytest.importorskip("tensorflow")
pytest.importorskip("keras")


@pytest.fixture
def hora_single():
    """``hora.native`` initialized as a one-rank job in this process; shut down afterwards."""
    import hora.native as hn

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HORA_")}
    hn.init()
    try:
        yield hn
    finally:
        hn.shutdown()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def spark():
    """One SparkSession local[2] (UI off, loopback only) for the KerasEstimator tests."""
    import sys

    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hora-keras-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dask_client():
    """One Dask LocalCluster with 2 worker processes, and its Client."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, silence_logs=40)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


def digits_frame(n: int | None = None):
    """scikit-learn's digits as a pandas frame: ``features`` (64 float32 per row), ``label`` (int64)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype("float32")
    y = d.target.astype("int64")
    if n is not None:
        x, y = x[:n], y[:n]
    return pd.DataFrame({"features": [row for row in x], "label": y}), x, y
