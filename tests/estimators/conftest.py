"""Fixtures of the estimator tests: a Store and small data (Spark and Dask come from tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.estimators.frames import regression_frame


@pytest.fixture()
def store(tmp_path):
    from hora.store import Store

    return Store.create(str(tmp_path / "store"))


@pytest.fixture()
def reg_pandas():
    return regression_frame()
