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
    from tests.single_rank import one_rank_job

    with one_rank_job(hn):
        yield hn


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
