"""When a fit prestarts the ranks' hosts (:meth:`hora.runners.Launcher.prestart`).

Spark's prestart is a short job whose tasks hold the slots the training stage then waits for, so
a Spark fit starts it only when the data is written (the job hides behind the writing); a fit
whose data is already materialized (the same frame again) runs no prestart job. A launcher whose
prestart takes no slots (the local one: a process of this host) prestarts on every fit.
"""

from __future__ import annotations

import pytest
import torch

from tests.estimators.frames import mlp, regression_columns

pytestmark = pytest.mark.timeout(600)


def _recording(monkeypatch, cls) -> list[int]:
    """Count ``cls.prestart`` calls (the real one still runs)."""
    calls: list[int] = []
    real = cls.prestart

    def prestart(self, num_proc, env):
        calls.append(num_proc)
        return real(self, num_proc, env)

    monkeypatch.setattr(cls, "prestart", prestart)
    return calls


def _args(store) -> dict:
    net = mlp()
    return dict(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
                loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=32,
                epochs=1, random_seed=0, verbose=0)


@pytest.mark.spark
def test_a_spark_fit_prestarts_only_when_it_writes_the_data(spark, store, monkeypatch):
    from pyspark.ml.feature import VectorAssembler

    from hora.runners.launchers.spark import SparkLauncher
    from hora.spark import TorchEstimator

    calls = _recording(monkeypatch, SparkLauncher)
    pdf = regression_columns(n=128, seed=5)
    df = VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(spark.createDataFrame(pdf))

    TorchEstimator(**_args(store)).fit(df)
    assert calls == [2], "the fit that materialized the data did not prestart the executors' servers"
    again = TorchEstimator(**_args(store)).fit(df)
    assert calls == [2], "a fit whose data was already materialized ran a prestart job"
    assert len(again.getHistory()) == 1
    assert len(store.listdir(store.layout.datasets_dir())) == 1, "the second fit wrote the data again"


def test_a_local_fit_prestarts_also_when_the_data_is_reused(reg_pandas, store, monkeypatch):
    from hora.runners.launchers.hosts import HostsLauncher
    from hora.dask import TorchEstimator

    calls = _recording(monkeypatch, HostsLauncher)
    TorchEstimator(**_args(store)).fit(reg_pandas)
    again = TorchEstimator(**_args(store)).fit(reg_pandas)
    assert calls == [2, 2]
    assert len(again.history_) == 1
