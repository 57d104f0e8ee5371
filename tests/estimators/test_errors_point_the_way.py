"""Errors that point the way: a misspelt keyword names the closest parameter,
label_nan is an estimator parameter, a frame of the wrong engine names the face to use, and a
pickling failure names the parameter and the attribute path of what cannot be pickled."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, DataError
from hora.estimators.params import ParamError
from hora.estimators.spec import freeze
from hora.store import Store

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("face", ["hora.spark", "hora.dask"])
def test_a_misspelt_keyword_names_the_closest_parameter(face):
    import importlib

    TorchEstimator = importlib.import_module(face).TorchEstimator
    with pytest.raises(ParamError, match=r"no parameter 'feture_cols'.*did you mean 'feature_cols'\?") as info:
        TorchEstimator(feture_cols=["x"])
    assert "label_cols" not in str(info.value), "the message lists every parameter instead of the closest one"
    with pytest.raises(ParamError, match=r"no parameter 'zzz_unrelated'.*help\(TorchEstimator\)"):
        TorchEstimator(zzz_unrelated=1)
    with pytest.raises(ParamError, match="NVTabular"):  # Horovod's keywords keep their explanation
        TorchEstimator(continuous_cols=["x"])


def _frame(n: int = 96, nan_rows: int = 0) -> pd.DataFrame:
    x = np.arange(n, dtype="float32").reshape(n, 1) / n
    y = 2 * x[:, 0]
    y[:nan_rows] = np.nan
    return pd.DataFrame({"x": list(x), "y": y})


def _estimator(tmp_path, **kw):
    from hora.dask import TorchEstimator

    net = torch.nn.Linear(1, 1)
    return TorchEstimator(num_proc=1, backend="local", store=Store.create(str(tmp_path / "store")), model=net,
                          optimizer=torch.optim.SGD(net.parameters(), 0.1), loss=torch.nn.MSELoss(),
                          feature_cols=["x"], label_cols=["y"], batch_size=16, epochs=1, verbose=0, **kw)


def test_label_nan_is_an_estimator_parameter_passed_to_the_materialization(tmp_path):
    with pytest.raises(ConfigError, match="label_nan must be one of 'error', 'drop', 'keep', got 'skip'"):
        _estimator(tmp_path, label_nan="skip").fit(_frame())
    with pytest.raises(DataError, match="label_nan"):  # the default still refuses NaN labels, and says what to pass
        _estimator(tmp_path).fit(_frame(nan_rows=5))
    model = _estimator(tmp_path, label_nan="drop").fit(_frame(nan_rows=5))
    assert model.history_, "the fit with label_nan='drop' did not train"


def test_a_pandas_frame_given_to_hora_spark_names_hora_dask():
    from hora.spark import TorchEstimator

    est = TorchEstimator(feature_cols=["x"], label_cols=["y"])
    with pytest.raises(TypeError, match=r"takes a Spark DataFrame, got a pandas DataFrame .*use hora\.dask\."
                                        r"TorchEstimator for it, or spark\.createDataFrame\(pdf\)"):
        est.fit(_frame())


def test_a_dask_frame_given_to_hora_spark_names_hora_dask():
    import dask.dataframe as dd

    from hora.spark import TorchEstimator

    with pytest.raises(TypeError, match=r"got a Dask DataFrame .*use hora\.dask\.TorchEstimator"):
        TorchEstimator(feature_cols=["x"], label_cols=["y"]).fit(dd.from_pandas(_frame(), npartitions=1))


@pytest.mark.spark
def test_a_spark_frame_given_to_hora_dask_names_hora_spark(spark):
    from hora.dask import TorchEstimator

    sdf = spark.createDataFrame(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}))
    with pytest.raises(TypeError, match=r"takes a Dask or pandas DataFrame or a Ray Dataset, got a Spark DataFrame"
                                        r" .*use hora\.spark\.TorchEstimator"):
        TorchEstimator(feature_cols=["x"], label_cols=["y"]).fit(sdf)


class _LossWithALock(torch.nn.MSELoss):
    def __init__(self) -> None:
        super().__init__()
        self.cache = {"lock": threading.Lock()}


def test_a_pickling_failure_names_the_parameter_and_the_attribute_path():
    with pytest.raises(ConfigError, match=r"cannot pickle the parameter 'loss' for the training workers: "
                                          r"loss\.cache\['lock'\] \(a _thread\.lock\)"):
        freeze({"model": torch.nn.Linear(1, 1), "loss": _LossWithALock(), "metrics": None})


def test_an_unpicklable_submodule_is_named_by_its_module_path():
    net = torch.nn.Sequential(torch.nn.Linear(1, 2), torch.nn.ReLU())
    net[1].handle = threading.Lock()
    with pytest.raises(ConfigError, match=r"parameter 'model' .*model\.1\.handle \(a _thread\.lock\)"):
        freeze({"model": net, "loss": torch.nn.MSELoss()})


def test_a_callback_list_is_named_with_its_index():
    with pytest.raises(ConfigError, match=r"parameter 'callbacks' .*callbacks\[1\]"):
        freeze({"callbacks": [object(), threading.Lock()]})
