"""Fixtures of the estimator tests: a Store and small data (Spark and Dask come from tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest


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
