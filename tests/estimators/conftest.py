"""Fixtures of the estimator tests: one SparkSession local[2], one Dask LocalCluster, small data."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hora-estimator-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dask_client():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0", silence_logs=40
    )
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture()
def store(tmp_path):
    from hora.store import Store

    return Store.create(str(tmp_path / "store"))


def regression_data(n: int = 256, d: int = 4, seed: int = 0):
    """(X float32 (n, d), y float64 (n,)) of a noiseless linear target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    w = np.arange(1, d + 1, dtype="float32") / d
    return x, (x @ w + 0.5).astype("float64")


@pytest.fixture()
def reg_pandas():
    import pandas as pd

    x, y = regression_data()
    return pd.DataFrame({"features": list(x), "y": y})


def mlp(d: int = 4, out: int = 1, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.ReLU(), torch.nn.Linear(16, out))
