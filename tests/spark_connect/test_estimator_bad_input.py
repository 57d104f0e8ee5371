"""What a Spark Connect fit refuses, on the client, before any training task starts: more ranks than
the training stage's slots, a store the executors cannot reach, executors without hora."""

from __future__ import annotations

import pandas as pd
import pytest

from hora.errors import ConfigError, StoreError
from tests.spark_clusters import connect_mode, python_without_hora

pytestmark = pytest.mark.spark


def _estimator(store, **kw):
    import torch

    from hora.spark import TorchEstimator

    net = torch.nn.Linear(1, 1)
    args = dict(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                loss=torch.nn.MSELoss(), feature_cols=["x"], label_cols=["y"], input_shapes=[[-1, 1]], verbose=0)
    args.update(kw)
    return TorchEstimator(**args)


@pytest.mark.timeout(300)
def test_connect_fit_refuses_bad_input_on_the_client(connect_server, connect_spark, tmp_path):
    from hora.store import Store

    store = Store.create(str(tmp_path / "store"))
    pdf = pd.DataFrame({"x": [float(i) for i in range(16)], "y": [1.0] * 16})
    with connect_mode(connect_spark):
        df = connect_spark.createDataFrame(pdf)
        with pytest.raises(ConfigError, match=r"num_proc=3 needs 3 task slots .* has 2"):
            _estimator(store, num_proc=3).fit(df)
        with pytest.raises(ConfigError, match=r"num_proc=2 needs 2 task slots .* with 2 CPU\(s\) each.* has 1"):
            _estimator(store, task_cpus=2).fit(df)
        assert not store.exists(store.layout.datasets_dir())  # refused before materializing anything
        with pytest.raises(StoreError, match=r"the Spark executors cannot use the store memory:///hora-bad-input"):
            _estimator(Store.create("memory://hora-bad-input")).fit(df)  # the client's memory, not theirs

    session = connect_server.session(**{"spark.sql.execution.pyspark.python": python_without_hora(tmp_path)})
    try:
        with connect_mode(session):
            with pytest.raises(ConfigError, match=r"cannot import hora") as info:
                _estimator(store).fit(session.createDataFrame(pdf))
        assert "PYSPARK_PYTHON" in str(info.value) and "python-without-hora" in str(info.value)
    finally:
        session.stop()
    assert store.listdir(store.layout.runs_dir()) == []  # no training run ever started
