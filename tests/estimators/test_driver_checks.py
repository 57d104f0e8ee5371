"""Bad input fails on the driver with a clear error, before anything is materialized or launched."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, DataError
from tests.estimators.frames import mlp

pytestmark = pytest.mark.timeout(120)


def _est(store_, **kw):
    from hora.dask import TorchEstimator

    net = kw.pop("model", None) or mlp()
    opt = kw.pop("optimizer", None) or torch.optim.SGD(net.parameters(), lr=0.1)
    args = dict(num_proc=2, store=store_, model=net, optimizer=opt,
                loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=8, epochs=1)
    args.update(kw)
    return TorchEstimator(**args)


def _nothing_launched(store):
    assert not store.exists(store.layout.datasets_dir()), "materialize ran"
    assert not store.exists(store.layout.runs_dir()), "workers ran"


@pytest.mark.parametrize(
    "kw, error, words",
    [
        ({"feature_cols": ["nope"]}, DataError, ["'nope' (feature_cols)"]),
        ({"label_cols": ["missing_label"]}, DataError, ["'missing_label' (label_cols)"]),
        ({"sample_weight_col": "w"}, DataError, ["'w' (sample_weight_col)"]),
        ({"batch_size": 0}, ConfigError, ["batch_size", "> 0"]),
        ({"batch_size": -3}, ConfigError, ["batch_size"]),
        ({"epochs": 0}, ConfigError, ["epochs", ">= 1"]),
        ({"num_proc": 0}, ConfigError, ["num_proc", ">= 1"]),
        ({"store": None}, ConfigError, ["store is required"]),
        ({"loss": [torch.nn.MSELoss(), torch.nn.MSELoss()]}, ConfigError, ["loss has 2 entries", "1 label_cols"]),
        ({"validation": 1.5}, ConfigError, ["validation"]),
        ({"lr_scaling": "sqrt"}, ConfigError, ["lr_scaling"]),
        ({"learning_rate": -1.0}, ConfigError, ["learning_rate"]),
        ({"input_shapes": [[-1, 2, 2], [-1, 4]]}, ConfigError, ["input_shapes has 2 shapes"]),
        ({"callbacks": [object()]}, ConfigError, ["callbacks"]),
    ],
)
def test_bad_params_and_columns(reg_pandas, store, kw, error, words):
    with pytest.raises(error) as info:
        _est(store, **kw).fit(reg_pandas)
    for word in words:
        assert word in str(info.value)
    _nothing_launched(store)


def test_model_must_be_a_module(reg_pandas, store):
    net = mlp()
    est = _est(store, model=lambda x: x, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="torch.nn.Module, got function"):
        est.fit(reg_pandas)
    _nothing_launched(store)


def test_optimizer_must_be_bound_to_the_model(reg_pandas, store):
    other = mlp(seed=5)
    est = _est(store, optimizer=torch.optim.Adam(other.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="not bound to the model's parameters"):
        est.fit(reg_pandas)
    with pytest.raises(ConfigError, match="optimizer factory must return"):
        _est(store, optimizer=lambda params: 3).fit(reg_pandas)
    _nothing_launched(store)


def test_label_shape_must_match_model_output(reg_pandas, store):
    est = _est(store, model=mlp(out=3))
    with pytest.raises(ConfigError) as info:
        est.fit(reg_pandas)
    assert "label 'y'" in str(info.value) and "(3,)" in str(info.value)
    _nothing_launched(store)


def test_wrong_number_of_outputs(reg_pandas, store):
    df = reg_pandas.assign(z=reg_pandas["y"] * 2)
    with pytest.raises(ConfigError, match="1 outputs but there are 2 label_cols"):
        _est(store, label_cols=["y", "z"]).fit(df)
    _nothing_launched(store)


def test_forward_failure_names_the_inputs(reg_pandas, store):
    with pytest.raises(ConfigError, match=r"forward pass failed.*\(16, 4\)"):
        _est(store, model=mlp(d=7)).fit(reg_pandas)


def test_missing_column_on_spark(spark, store):
    df = spark.createDataFrame(pd.DataFrame({"a": [1.0, 2.0], "y": [0.0, 1.0]}))
    from hora.spark import TorchEstimator

    net = mlp()
    est = TorchEstimator(num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                         loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"])
    with pytest.raises(DataError, match=r"'features' \(feature_cols\).*\['a', 'y'\]"):
        est.fit(df)
    _nothing_launched(store)


def test_dask_fit_without_client_is_a_config_error(tmp_path):
    code = f"""
import dask, dask.dataframe as dd, pandas as pd, torch
from hora.dask import TorchEstimator
from hora.errors import ConfigError
from hora.store import Store
net = torch.nn.Linear(1, 1)
ddf = dd.from_pandas(pd.DataFrame({{"x": [1.0, 2.0], "y": [0.0, 1.0]}}), npartitions=1)
est = TorchEstimator(store=Store.create({str(tmp_path)!r}), model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                     loss=torch.nn.MSELoss(), feature_cols=["x"], label_cols=["y"])
try:
    est.fit(ddf)
except ConfigError as exc:
    print("CONFIG_ERROR:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert "CONFIG_ERROR:" in out.stdout, out.stderr[-2000:]
    assert "active distributed.Client" in out.stdout


def test_spark_params_are_generated_with_accessors():
    from hora.spark import TorchEstimator

    est = TorchEstimator(batch_size=16, learning_rate=0.1)
    assert est.getBatchSize() == 16 and est.getLearningRate() == 0.1 and est.getEpochs() == 1
    assert est.setEpochs(4) is est and est.getEpochs() == 4
    assert est.getLrScaling() == "linear"
    assert est.batch_size.name == "batch_size" and "rows per training batch" in est.batch_size.doc
    from hora.estimators.faces import spark as spark_face

    assert issubclass(TorchEstimator, spark_face.EstimatorParams) and "batch_size" not in vars(TorchEstimator)
    with pytest.raises(ConfigError, match="no parameter .batchsize..*did you mean .batch_size."):
        TorchEstimator(batchsize=3)
    with pytest.raises(TypeError):
        TorchEstimator(16)
