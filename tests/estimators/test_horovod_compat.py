"""Horovod's paths and keywords, bad input caught on the driver, and the pieces around the loop.

(Training with Horovod's parameters runs in tests/estimators/test_suite.py.)
"""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError
from tests.estimators.frames import mlp
from tests.estimators.test_driver_checks import _est, _nothing_launched

pytestmark = pytest.mark.timeout(120)


def test_horovod_module_paths():
    code = """
import sys
import hora.spark, hora.spark.torch as hst
from hora.spark import TorchEstimator
from hora.spark.common.store import Store
from hora.spark.common.backend import Backend, SparkBackend
import hora.store
assert hst.TorchEstimator is TorchEstimator and hst.TorchModel is hora.spark.TorchModel
assert Store is hora.store.Store and issubclass(SparkBackend, Backend)
assert TorchEstimator.__module__ == "hora.spark.torch.estimator"  # Horovod's module
assert "tensorflow" not in sys.modules and "keras" not in sys.modules, "importing hora.spark imported TensorFlow"
from hora.spark.common.store import HDFSStore, LocalStore
assert LocalStore is hora.store.LocalStore and HDFSStore is hora.store.HDFSStore
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_horovod_keywords_hora_does_not_take_say_what_to_use(store):
    from hora.dask import TorchEstimator as DaskTorch
    from hora.estimators.params import ParamError
    from hora.spark import TorchEstimator

    for make in (TorchEstimator, DaskTorch):
        with pytest.raises(ParamError, match="continuous_cols.*feature_cols") as info:
            make(continuous_cols=["a"])
        assert isinstance(info.value, TypeError) and isinstance(info.value, ConfigError)
        with pytest.raises(ParamError, match="label_shapes.*transformation_fn"):
            make(label_shapes=[[1]])
        with pytest.raises(ParamError, match="custom_objects.*Keras"):
            make(custom_objects={})
        with pytest.raises(ParamError, match=r"no parameter 'bogus'"):
            make(bogus=1)
    with pytest.raises(ConfigError, match="at most one of backend and num_proc"):
        from hora.spark.common.backend import SparkBackend

        _est(store, backend=SparkBackend(num_proc=2)).fit(pd.DataFrame({"features": [1.0], "y": [1.0]}))
    with pytest.raises(ConfigError, match="only one of loss and loss_constructors"):
        _est(store, loss_constructors=[torch.nn.MSELoss])._config()
    assert isinstance(_est(store, loss=None, loss_constructors=[torch.nn.L1Loss])._config().loss, torch.nn.L1Loss)
    _nothing_launched(store)


def test_petastorm_knobs_are_accepted_with_one_warning(store, caplog, monkeypatch):
    from hora.estimators import params

    monkeypatch.setattr(params, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="hora.estimators.params"):
        for _ in range(2):
            _est(store, reader_pool_type="process", train_reader_num_workers=4, val_reader_num_workers=2,
                 mp_start_method="spawn")._config()
    texts = [r.getMessage() for r in caplog.records]
    assert len(texts) == 2, texts  # one per ignored knob, not per fit (reader_pool_type, mp_start_method: honoured)
    assert any("train_reader_num_workers=4" in t and "background thread" in t for t in texts)
    with pytest.raises(ConfigError, match="reader_pool_type must be 'thread' or 'process'"):
        _est(store, reader_pool_type="processes")._config()
    with pytest.raises(ConfigError, match="mp_start_method"):
        _est(store, mp_start_method="vfork")._config()


def test_spark_backend_options():
    from hora.spark.common.backend import SparkBackend

    from hora.runners.spec import ENV_NETWORK_INTERFACE, ENV_WORKER_PYTHON

    with pytest.raises(ConfigError, match="use_mpi"):
        SparkBackend(use_mpi=True)
    with pytest.raises(ConfigError, match="unknown keyword"):
        SparkBackend(num_procs=2)
    opts = SparkBackend(num_proc=3, env={"A": "1"}, nics=["lo"], use_gloo=True, stdout=sys.stdout,
                        prefix_output_with_timestamp=True, executable="/usr/bin/python3").launch_options()
    assert opts["num_proc"] == 3 and opts["stdout"] is sys.stdout and opts["timestamps"] is True
    assert opts["env"] == {"A": "1", ENV_NETWORK_INTERFACE: "lo", ENV_WORKER_PYTHON: "/usr/bin/python3"}


def test_run_id_has_one_rule(store):
    from hora.estimators.params import EstimatorConfig

    base = dict(store=store, model=object(), optimizer=object(), loss=torch.nn.MSELoss(), feature_cols=["x"],
                label_cols=["y"])
    EstimatorConfig(**base, run_id="r" * 128)
    with pytest.raises(ConfigError, match="1-128 characters"):  # the runners' and store's names: at config time
        EstimatorConfig(**base, run_id="r" * 150)


def test_feature_groups_bad_input_before_launch(store):
    df = pd.DataFrame({"a": np.arange(8, dtype="float32"), "b": np.arange(8, dtype="int64"),
                       "c": np.arange(8, dtype="float32"), "v": list(np.ones((8, 2), dtype="float32")),
                       "y": np.ones(8)})
    with pytest.raises(ConfigError, match=r"feature group \[a,b\] mixes dtypes"):
        _est(store, model=mlp(d=2), feature_cols=[["a", "b"]]).fit(df)
    with pytest.raises(ConfigError, match=r"feature group \[a,v\] holds column 'v'"):
        _est(store, model=mlp(d=3), feature_cols=[["a", "v"]]).fit(df)
    with pytest.raises(ConfigError, match="more than once"):
        _est(store, feature_cols=[["a", "c"], "a"])._config()
    with pytest.raises(ConfigError, match=r"forward pass failed.*group them: feature_cols=\[\['a', 'c'"):
        _est(store, model=mlp(d=2), feature_cols=["a", "c"]).fit(df)  # a Linear(2, ...) called with 2 inputs
    _nothing_launched(store)


def test_keras_and_mlflow_bad_input_before_launch(store):
    pytest.importorskip("mlflow")
    from hora.estimators.callbacks import MLflowLogger

    df = pd.DataFrame({"features": list(np.ones((8, 4), dtype="float32")), "y": np.ones(8)})
    with pytest.raises(ConfigError, match="cannot be reached"):
        _est(store, callbacks=[MLflowLogger(tracking_uri="http://127.0.0.1:9")]).fit(df)
    with pytest.raises(ConfigError, match="tracking_uri"):
        MLflowLogger(tracking_uri="")
    with pytest.raises(ConfigError, match="train_minibatch_fn must be callable"):
        _est(store, train_minibatch_fn=3)._config()
    _nothing_launched(store)


def test_cached_reader_serves_the_same_rows_from_memory(tmp_path):
    from hora.estimators.worker.loop import CachedReader
    from hora.store import Store, make_reader, materialize

    store = Store.create(str(tmp_path / "store"))
    info = materialize(pd.DataFrame({"x": np.arange(50, dtype="float32"), "y": np.zeros(50)}), store,
                       feature_cols=["x"], label_cols=["y"])
    cached = CachedReader(make_reader(store, info, rank=0, size=2, batch_size=8, shuffle=True))
    first = list(cached)
    cached._source = None  # a second pass must not read the store again
    cached.set_epoch(1)
    second = list(cached)
    assert [len(b["x"]) for b in first] == [len(b["x"]) for b in second] and len(second) == len(cached)
    a, b = np.concatenate([x["x"] for x in first]), np.concatenate([x["x"] for x in second])
    assert sorted(a) == sorted(b) and not np.array_equal(a, b)  # the same rows, shuffled anew


def test_progress_has_one_bar_per_epoch_with_a_total(capsys):
    from hora.runners.driver.progress import Progress

    progress = Progress("run-x", interactive=True)
    for epoch in (1, 2):
        for step in (1, 3):
            progress.update(0, {"epoch": epoch, "epochs": 2, "step": step, "total": 4, "loss": 0.5})
        first_bar = progress._bar
        assert first_bar.total == 4 and first_bar.n == 3 and "epoch" in first_bar.desc
        progress.update(0, {"epoch": epoch, "epochs": 2, "step": 4, "total": 4, "loss": 0.25, "val_loss": 0.125})
        assert "val_loss=0.125" in str(first_bar)
    # the epoch's last report overtaken by the next epoch's: the closed bar still shows its metrics
    progress.update(0, {"epoch": 3, "epochs": 3, "step": 1, "total": 4, "loss": 0.5})
    closing = progress._bar
    progress.update(0, {"epoch": 4, "epochs": 4, "step": 1, "total": 4, "loss": 0.5,
                        "last_epoch": {"loss": 0.3, "val_loss": 0.0625}})
    assert closing.n == 4 and "val_loss=0.0625" in str(closing) and progress._bar is not closing
    progress.close()
    err = capsys.readouterr().err
    assert "epoch 1/2: 100%" in err and "epoch 2/2: 100%" in err and "run-x" not in err  # the id is in the header


def test_lightning_bad_input_before_launch(store):
    pytest.importorskip("lightning")
    import lightning as L

    from hora.dask import LightningEstimator
    from tests.estimators import frames

    df = pd.DataFrame({"features": list(np.ones((8, 64), dtype="float32")), "label": np.zeros(8)})

    class NoOptimizers(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 2)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            return self(batch["features"]).sum()

    def est(**kw):
        args = dict(num_proc=2, store=store, model=frames.lightning_image_module(), feature_cols=["features"],
                    label_cols=["label"], epochs=1)
        args.update(kw)
        return LightningEstimator(**args)

    with pytest.raises(ConfigError, match="configure_optimizers"):
        est(model=NoOptimizers()).fit(df)
    with pytest.raises(ConfigError, match="'max_epoch'.*did you mean 'max_epochs'"):
        est(trainer_args={"max_epoch": 3}).fit(df)
    with pytest.raises(ConfigError, match="strategy"):
        est(trainer_args={"strategy": "ddp"}).fit(df)
    with pytest.raises(ConfigError, match="optimizer= does not apply"):
        est(optimizer=torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))._config()
    with pytest.raises(ConfigError, match="accumulate_grad_batches"):
        est(backward_passes_per_step=2)._config()
    _nothing_launched(store)
