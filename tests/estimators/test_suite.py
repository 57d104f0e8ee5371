"""Both faces x every framework through one suite: fit, transform/predict, save/load, resume by run_id, callbacks.

Each case also passes what users of that face and framework pass: Horovod's estimator
parameters on Spark (``backend=SparkBackend(...)``, ``input_shapes``, ``partitions_per_process``,
``inmemory_cache_all``, ``train_minibatch_fn``, ``setOutputCols``, a flat vector reshaped to
a Keras model's input, one-hot ``SparseVector`` labels, Keras ``TensorBoard`` and
``checkpoint_callback``), and Dask users' frames (64 scalar columns as one feature group, an
array column under Dask's default config, a shuffled index) with MLflow on a sqlite store. The Spark
Connect paths run in tests/estimators/test_spark_face.py (see ``CASES`` below).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from hora.estimators.callbacks import Callback
from tests.estimators import frames

pytestmark = pytest.mark.timeout(900)


class EpochRecorder(Callback):
    """Writes ``cb-<rank>-<epoch>.json`` with the epoch logs each rank saw (hora's callbacks ran there)."""

    def on_epoch_end(self, ctx, epoch, logs):
        ctx.store.write_json(f"{ctx.store.layout.run_dir(ctx.run_id)}/cb-{ctx.rank}-{epoch}.json", logs)


def _recorded(store, run_id, epoch):
    return [store.read_json(f"{store.layout.run_dir(run_id)}/cb-{rank}-{epoch}.json") for rank in (0, 1)]


def _check_resume(first_history, make, df, run_id, store):
    """A second fit with the same run_id and epochs=2 trains only epoch 1 (epoch 0 comes from the checkpoint)."""
    second = make(2).fit(df)
    history = second.getHistory() if hasattr(second, "getHistory") else second.history_
    assert [h["epoch"] for h in history] == [0, 1]
    assert history[0] == first_history[0]
    assert store.list_checkpoints(run_id) == [0, 1]
    return second


# ---------------------------------------------------------------------------------------
# Spark x Torch, as Horovod's examples/spark/pytorch/pytorch_spark_mnist.py passes it
# ---------------------------------------------------------------------------------------
def _spark_torch(request, tmp_path, spark):
    import torch
    from pyspark.ml.feature import OneHotEncoder  # noqa: F401  (the Horovod example's imports work)

    import hora.spark.torch as hvd
    from hora.spark.common.backend import SparkBackend
    from hora.spark.common.store import Store
    from hora.store import load_dataset_info

    df = spark.createDataFrame(frames.sparse_images(96), ["features", "label"])
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-spark-torch"

    def make(epochs):
        model = frames.torch_image_net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        nll = torch.nn.NLLLoss()
        backend = SparkBackend(num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True)
        return hvd.TorchEstimator(
            backend=backend, store=store, model=model, optimizer=optimizer,
            loss=lambda input, target: nll(input, target.long()), input_shapes=[[-1, 1, 8, 8]],
            feature_cols=["features"], label_cols=["label"], batch_size=16, epochs=epochs, validation=0.25,
            verbose=0, random_seed=0, run_id=run_id, partitions_per_process=2, inmemory_cache_all=True,
            train_minibatch_fn=frames.horovod_minibatch, reader_pool_type="thread", callbacks=[EpochRecorder()])

    model = make(1).fit(df).setOutputCols(["label_prob"])
    assert isinstance(model, hvd.TorchModel) and model.getOutputCols() == ["label_prob"]
    calls = float(model.getModel().minibatch_calls)
    assert calls >= 1  # the Horovod-style minibatch function ran every step
    (fingerprint,) = store.listdir(store.layout.datasets_dir())
    info = load_dataset_info(store, fingerprint.rsplit("/", 1)[-1])
    assert len(info.train_files) >= 4  # partitions_per_process=2 x 2 ranks
    assert all(set(logs) >= {"loss", "val_loss"} for logs in _recorded(store, run_id, 0))

    out = model.transform(df)
    assert out.columns == ["features", "label", "label_prob"]
    rows = out.limit(8).collect()
    probs = np.exp(np.array([r.label_prob for r in rows]))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    x = torch.tensor(np.stack([r.features.toArray() for r in rows]), dtype=torch.float32).reshape(-1, 1, 8, 8)
    np.testing.assert_allclose(np.log(probs), model.getModel()(x).detach().numpy(), rtol=1e-4, atol=1e-5)

    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = hvd.TorchModel.load(path)
    a = np.array([r.label_prob for r in loaded.transform(df).limit(8).collect()])
    np.testing.assert_array_equal(a, np.array([r.label_prob for r in rows]))

    second = _check_resume(model.getHistory(), make, df, run_id, store)
    assert float(second.getModel().minibatch_calls) == 2 * calls  # the checkpoint's buffers came back, then epoch 1


# ---------------------------------------------------------------------------------------
# Spark x Keras, as Horovod's examples/spark/keras/keras_spark_mnist.py passes it
# ---------------------------------------------------------------------------------------
def _spark_keras(request, tmp_path, spark):
    keras = pytest.importorskip("keras")
    from pyspark.ml.feature import OneHotEncoder

    import hora.spark.keras as hvd
    from hora.estimators.frameworks.keras.io import model_from_bytes
    from hora.spark.common.backend import SparkBackend
    from hora.spark.common.store import Store

    df = spark.createDataFrame(frames.sparse_images(96), ["features", "label"])
    df = OneHotEncoder(inputCols=["label"], outputCols=["label_vec"], dropLast=False).fit(df).transform(df)
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-spark-keras"

    def make(epochs):
        return hvd.KerasEstimator(
            backend=SparkBackend(num_proc=2), store=store, model=frames.keras_image_net(),
            optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.categorical_crossentropy, metrics=["accuracy"],
            feature_cols=["features"], label_cols=["label_vec"], batch_size=16, epochs=epochs, validation=0.25,
            random_seed=1, inmemory_cache_all=True, verbose=0, run_id=run_id, custom_objects={},
            callbacks=[keras.callbacks.TensorBoard(), EpochRecorder()],
            checkpoint_callback=keras.callbacks.ModelCheckpoint("any.keras", monitor="val_loss", save_best_only=True))

    model = make(1).fit(df).setOutputCols(["label_prob"])
    assert isinstance(model, hvd.KerasModel)
    assert model.getOrDefault("input_shapes") == [[-1, 8, 8, 1]]  # the flat 64-vector meets the model's input
    assert {"loss", "val_loss", "val_accuracy"} <= set(model.getHistory()[0])
    run_dir = store.layout.run_dir(run_id)
    assert any("tfevents" in p for p in store.listdir(store.layout.logs_dir(run_id) + "/train"))
    with open(run_dir + "/keras-checkpoint/checkpoint.keras", "rb") as fh:  # the model fit returned is the checkpoint's
        saved = model_from_bytes(fh.read(), compile=False)
    for a, b in zip(saved.get_weights(), model.getModel().get_weights()):
        np.testing.assert_array_equal(a, b)
    assert len(_recorded(store, run_id, 0)) == 2

    rows = model.transform(df).select("features", "label_prob").limit(8).collect()
    probs = np.array([r.label_prob for r in rows])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    x = np.stack([r.features.toArray() for r in rows]).reshape(-1, 8, 8, 1)
    np.testing.assert_allclose(probs, model.getModel().predict(x, verbose=0), rtol=1e-4, atol=1e-5)
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = hvd.KerasModel.load(path)
    again = np.array([r.label_prob for r in loaded.transform(df).select("label_prob").limit(8).collect()])
    np.testing.assert_allclose(again, probs, rtol=1e-6)
    _check_resume(model.getHistory(), make, df, run_id, store)


# ---------------------------------------------------------------------------------------
# Dask x Torch: 64 scalar columns as one feature group, an array column under the default
# dask config, a shuffled index, MLflow on a sqlite store
# ---------------------------------------------------------------------------------------
def _mlflow_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).create_experiment("hora-suite", artifact_location=(tmp_path / "artifacts").as_uri())
    return uri


def _dask_torch(request, tmp_path):
    import dask
    import dask.dataframe as dd
    import torch
    from mlflow.tracking import MlflowClient

    from hora.dask import TorchEstimator, TorchModel
    from hora.estimators.callbacks import MLflowLogger
    from hora.store import Store

    request.getfixturevalue("dask_client")
    uri = _mlflow_store(tmp_path)
    pdf = frames.scalar_frame(96)
    assert dask.config.get("dataframe.convert-string") is not False  # the users' default (None: on)
    ddf = dd.from_pandas(pdf, npartitions=3)
    assert ddf["extra"].dtype != object  # Dask turned the arrays into strings: hora must undo it
    group = [f"x{i}" for i in range(64)]
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-dask-torch"
    logger = MLflowLogger(tracking_uri=uri, experiment="hora-suite")

    def make(epochs):
        net = frames.torch_tabular_net()
        return TorchEstimator(num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), 0.01),
                              loss=torch.nn.MSELoss(), feature_cols=[group, "extra"], label_cols=["y"], batch_size=16,
                              epochs=epochs, validation=0.25, random_seed=0, verbose=0, run_id=run_id,
                              callbacks=[EpochRecorder(), logger])

    model = make(1).fit(ddf)
    assert model.feature_cols_ == [group, "extra"]
    assert len(_recorded(store, run_id, 0)) == 2
    # the step's wait for data: the largest over the ranks, as the callbacks (MLflow) saw it
    assert [r["data_wait"] for r in _recorded(store, run_id, 0)] == [model.history_[0]["data_wait"]] * 2

    pred = model.predict(ddf).compute()
    index = ddf.index.compute()
    assert list(pred.index) == list(index)  # the frame's rows, in its order, with its index
    x = torch.tensor(pdf.loc[index, group].to_numpy())
    extra = torch.tensor(np.stack(pdf.loc[index, "extra"]))
    np.testing.assert_allclose(pred.to_numpy(), model.model_(x, extra).detach().numpy().ravel(), rtol=1e-5, atol=1e-6)
    joined = pdf.join(pred.rename("pred"))  # aligns by index whatever from_pandas sorted
    np.testing.assert_allclose(joined["pred"].to_numpy(), model.transform(pdf)["prediction"].to_numpy(), rtol=1e-6)

    run = MlflowClient(uri).get_run(logger.run_id_)
    assert run.data.params["batch_size"] == "16" and run.data.params["hora_run_id"] == run_id
    assert [m.step for m in MlflowClient(uri).get_metric_history(logger.run_id_, "val_loss")] == [0]
    assert [m.step for m in MlflowClient(uri).get_metric_history(logger.run_id_, "data_wait")] == [0]
    artifacts = [a.path for a in MlflowClient(uri).list_artifacts(logger.run_id_, "model")]
    assert {"model/model.pkl", "model/weights.pt"} <= set(artifacts)
    assert run.info.status == "FINISHED"

    url = f"file://{tmp_path}/saved"
    model.save(url)
    loaded = TorchModel.load(url)
    np.testing.assert_array_equal(loaded.predict(pdf.head(10)).to_numpy(), model.predict(pdf.head(10)).to_numpy())
    _check_resume(model.history_, make, ddf, run_id, store)
    assert [m.step for m in MlflowClient(uri).get_metric_history(logger.run_id_, "val_loss")] == [1]


# ---------------------------------------------------------------------------------------
# Dask x Keras: a feature group into a Keras model, Keras and hora callbacks, two backward passes
# per step (Horovod's backward_passes_per_step), resumed from the Keras checkpoint
# ---------------------------------------------------------------------------------------
def _dask_keras(request, tmp_path):
    keras = pytest.importorskip("keras")
    import dask.dataframe as dd

    from hora.dask import KerasEstimator, KerasModel
    from hora.store import Store

    request.getfixturevalue("dask_client")
    pdf = frames.scalar_frame(96, cols=8)
    ddf = dd.from_pandas(pdf, npartitions=2)
    group = [f"x{i}" for i in range(8)]
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-dask-keras"

    def make(epochs):
        return KerasEstimator(num_proc=2, store=store, model=frames.keras_group_net(), optimizer="adam", loss="mse",
                              feature_cols=[group], label_cols=["y"], batch_size=16, epochs=epochs, validation=0.25,
                              random_seed=0, verbose=0, run_id=run_id, backward_passes_per_step=2,
                              callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=5), EpochRecorder()])

    model = make(1).fit(ddf)
    assert len(_recorded(store, run_id, 0)) == 2
    assert 0.0 <= model.history_[0]["data_wait"] <= 1.0  # timed through the tf.data pipeline
    pred = model.predict(ddf).compute()
    index = ddf.index.compute()
    assert list(pred.index) == list(index)
    local = model.model_.predict(pdf.loc[index, group].to_numpy(), verbose=0).ravel()
    np.testing.assert_allclose(pred.to_numpy(), local, rtol=1e-4, atol=1e-5)
    model.save("memory://hora-suite/keras")
    loaded = KerasModel.load("memory://hora-suite/keras")
    np.testing.assert_allclose(loaded.predict(pdf.head(10)).to_numpy(), model.predict(pdf.head(10)).to_numpy(),
                               rtol=1e-6)
    second = _check_resume(model.history_, make, ddf, run_id, store)
    assert second.history_[1]["loss"] < model.history_[0]["loss"]  # epoch 1 trained on from the checkpoint's weights


# ---------------------------------------------------------------------------------------
# Spark x Lightning, as Horovod's examples/spark/pytorch/pytorch_lightning_spark_mnist.py passes it
# ---------------------------------------------------------------------------------------
class _Counter:
    """A Lightning callback counting train epoch ends (made on first use: Lightning is imported then)."""

    @staticmethod
    def make():
        import lightning as L

        class EpochCounter(L.Callback):
            def __init__(self) -> None:
                self.ends = 0

            def on_train_epoch_end(self, trainer, pl_module):
                self.ends += 1
                trainer.strategy.barrier()
                if trainer.is_global_zero:
                    store = pl_module.hora_store
                    store.write_json(store.layout.run_dir(pl_module.hora_run) + f"/pl-{trainer.current_epoch}.json",
                                     {"ends": self.ends, "step": trainer.global_step})

        return EpochCounter()


def _spark_lightning(request, tmp_path, spark):
    pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    import hora.spark.lightning as hvd
    from hora.spark.common.backend import SparkBackend
    from hora.spark.common.store import Store

    df = spark.createDataFrame(frames.sparse_images(96), ["features", "label"])
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-spark-lightning"

    def make(epochs):
        module = frames.lightning_image_module()
        module.hora_store, module.hora_run = store, run_id
        return hvd.TorchEstimator(
            backend=SparkBackend(num_proc=2), store=store, model=module, input_shapes=[[-1, 1, 8, 8]],
            feature_cols=["features"], label_cols=["label"], batch_size=8, epochs=epochs, validation=0.25,
            verbose=0, run_id=run_id, trainer_args={"accumulate_grad_batches": 2},
            callbacks=[ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1), _Counter.make(),
                       EpochRecorder()])

    model = make(1).fit(df).setOutputCols(["label_prob"])
    assert isinstance(model, hvd.TorchModel)
    history = model.getHistory()
    assert [h["epoch"] for h in history] == [0] and {"train_loss", "val_loss", "loss", "data_wait"} <= set(history[0])
    steps_0 = store.read_json(store.layout.run_dir(run_id) + "/pl-0.json")["step"]
    assert steps_0 >= 1  # optimizer steps: half the batches with accumulate_grad_batches=2
    assert len(_recorded(store, run_id, 0)) == 2
    rows = model.transform(df).select("features", "label_prob").limit(8).collect()
    probs = np.exp(np.array([r.label_prob for r in rows]))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = hvd.TorchModel.load(path)
    again = np.array([r.label_prob for r in loaded.transform(df).select("label_prob").limit(8).collect()])
    np.testing.assert_allclose(np.exp(again), probs, rtol=1e-6)
    _check_resume(history, make, df, run_id, store)
    # Lightning's checkpoint resumed: its step count and callbacks continued from epoch 0
    assert store.read_json(store.layout.run_dir(run_id) + "/pl-1.json")["step"] == 2 * steps_0


# ---------------------------------------------------------------------------------------
# Dask x Lightning with a LightningDataModule (the frame is only sampled for transform)
# ---------------------------------------------------------------------------------------
def _dask_lightning(request, tmp_path):
    pytest.importorskip("lightning")
    import dask.dataframe as dd
    import pandas as pd

    from hora.dask import LightningEstimator, LightningModel
    from hora.store import Store

    request.getfixturevalue("dask_client")
    pdf = pd.DataFrame({"features": [r[0].toArray().astype("float32") for r in frames.sparse_images(32)],
                        "label": [r[1] for r in frames.sparse_images(32)]})
    ddf = dd.from_pandas(pdf, npartitions=2)
    store = Store.create(str(tmp_path / "store"))
    run_id = "suite-dask-lightning"

    def make(epochs):
        return LightningEstimator(num_proc=2, store=store, model=frames.lightning_image_module(),
                                  data_module=frames.lightning_data_module(), feature_cols=["features"],
                                  label_cols=["label"], epochs=epochs, verbose=0, run_id=run_id,
                                  trainer_args={"accumulate_grad_batches": 2}, callbacks=[EpochRecorder()])

    model = make(1).fit(ddf)
    assert not store.exists(store.layout.datasets_dir())  # the DataModule brought the data
    assert {"train_loss", "val_loss"} <= set(model.history_[0]) and len(_recorded(store, run_id, 0)) == 2
    assert 0.0 <= model.history_[0]["data_wait"] <= 1.0  # Lightning's own loading: the gaps between its steps
    pred = model.predict(ddf).compute()
    import torch

    local = model.model_(torch.tensor(np.stack(pdf["features"]))).detach().numpy()
    np.testing.assert_allclose(np.stack(pred.to_numpy()), local, rtol=1e-5, atol=1e-6)
    model.save(f"file://{tmp_path}/saved")
    loaded = LightningModel.load(f"file://{tmp_path}/saved")
    np.testing.assert_allclose(np.stack(loaded.predict(pdf).to_numpy()), local, rtol=1e-6)
    _check_resume(model.history_, make, ddf, run_id, store)


CASES = {"spark-torch": _spark_torch, "spark-keras": _spark_keras, "spark-lightning": _spark_lightning,
         "dask-torch": _dask_torch, "dask-keras": _dask_keras, "dask-lightning": _dask_lightning}
#: No cell runs on Spark Connect here: the Connect paths (materialize, the fit's tasks, transform, save/load
#: in hora/_spark.py, estimators/faces/spark.py, estimators/driver/transform.py) are shared by every framework
#: (each Spark estimator class derives from faces.spark's SparkEstimator), and Torch's estimator runs them on a
#: Connect session in every test of tests/estimators/test_spark_face.py ([connect]) and in test_classification.py's
#: test_spark_connect_classifier_columns_and_evaluators. The Spark x Keras cell's Connect twin
#: (spark-keras-connect, the same assertions as spark-keras) was removed for that reason (to keep CI short),
#: as the Lightning x Connect cell was before it.


@pytest.mark.parametrize("case", list(CASES))
def test_face_x_framework(case, request, tmp_path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if case.startswith("spark-"):
        CASES[case](request, tmp_path, request.getfixturevalue("spark"))
    else:
        CASES[case](request, tmp_path)
