"""KerasEstimator fit / transform / save / load on Spark (local[2]) and Dask (LocalCluster), 2 ranks each.

A Keras fit resumed by run_id (with backward_passes_per_step=2) is tests/estimators/test_suite.py's
dask-keras case (and its Spark cases): the resume test that was here repeated it."""

from __future__ import annotations

import numpy as np
import pytest

from hora.errors import ConfigError, DataError
from tests.tensorflow.conftest import digits_frame

keras = pytest.importorskip("keras")

pytestmark = [pytest.mark.tf, pytest.mark.timeout(600)]


# ---------------------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark_fit(spark, tmp_path_factory):
    from hora.spark import KerasEstimator
    from hora.store import Store
    from tests.tensorflow.keras_models import digits_mlp

    pdf, x, y = digits_frame()
    df = spark.createDataFrame([( [float(v) for v in row], int(label)) for row, label in zip(x, y)],
                               "features array<float>, label long")
    store = Store.create(str(tmp_path_factory.mktemp("keras-spark-store")))
    net = digits_mlp()
    before = [w.copy() for w in net.get_weights()]
    est = KerasEstimator(num_proc=2, store=store, model=net, optimizer=keras.optimizers.Adam(0.003),
                         loss="sparse_categorical_crossentropy", metrics=["accuracy"], feature_cols=["features"],
                         label_cols=["label"], batch_size=32, epochs=4, validation=0.2, random_seed=1, verbose=0)
    model = est.fit(df)
    return est, model, df, x, y, net, before, store


def test_spark_fit_trains_on_two_ranks(spark_fit):
    from hora.spark import KerasModel as SparkKerasModel

    est, model, df, x, y, net, before, store = spark_fit
    assert isinstance(model, SparkKerasModel)
    hist = model.getHistory()
    assert len(hist) == 4 and {"loss", "val_loss", "val_accuracy"} <= set(hist[0])
    assert hist[-1]["loss"] < 0.6 * hist[0]["loss"]
    assert hist[-1]["val_accuracy"] > 0.8
    for w, b in zip(net.get_weights(), before):  # the user's model is untouched
        np.testing.assert_array_equal(w, b)
    assert isinstance(model.getModel(), keras.Model)
    assert store.list_checkpoints(model.getOrDefault("run_id")) == [0, 1, 2, 3]


def test_spark_transform_on_executors(spark_fit):
    est, model, df, x, y, *_ = spark_fit
    # sparse_categorical_crossentropy makes a classifier: MLlib's probability vectors and class index
    scored = model.transform(df).select("label", "probability", "prediction").toPandas()
    assert len(scored) == len(x)
    probs = np.stack([v.toArray() for v in scored["probability"]])
    assert probs.shape == (len(x), 10)
    np.testing.assert_array_equal(scored["prediction"].to_numpy(), probs.argmax(axis=1))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    assert (probs.argmax(axis=1) == scored["label"].to_numpy()).mean() > 0.85
    local = model.getModel().predict(x[:20], verbose=0)
    np.testing.assert_allclose(probs[:20], local, rtol=1e-4, atol=1e-5)


def test_spark_save_load_model_and_estimator(spark_fit, tmp_path):
    from hora.spark import KerasEstimator, KerasModel

    est, model, df, x, *_ = spark_fit
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = KerasModel.load(path)
    assert loaded.getHistory() == model.getHistory()
    small = df.limit(30)
    assert loaded.getTask() == "classification"
    a = np.stack([v.toArray() for v in loaded.transform(small).toPandas()["probability"]])
    b = np.stack([v.toArray() for v in model.transform(small).toPandas()["probability"]])
    np.testing.assert_allclose(a, b, rtol=1e-6)
    copied = model.copy()
    assert copied.getModel() is not model.getModel()
    np.testing.assert_array_equal(copied.getModel().get_weights()[0], model.getModel().get_weights()[0])

    epath = str(tmp_path / "estimator")
    est.write().overwrite().save(epath)
    est2 = KerasEstimator.load(epath)
    assert est2.getEpochs() == 4 and est2.getBatchSize() == 32 and est2.getLoss() == "sparse_categorical_crossentropy"
    assert isinstance(est2.getModel(), keras.Model)


def test_spark_bad_input_fails_before_launch(spark_fit):
    from hora.spark import KerasEstimator

    est, model, df, *_ = spark_fit
    bad = est.copy({est.model: object()})
    with pytest.raises(ConfigError, match="keras.Model"):
        bad.fit(df)

    class OldAdam:  # a tf_keras optimizer as far as hora can tell
        pass

    OldAdam.__module__ = "tf_keras.src.optimizers.adam"
    with pytest.raises(ConfigError, match="Keras 2"):
        est.copy({est.optimizer: OldAdam()}).fit(df)
    with pytest.raises(ConfigError, match="no parameter .bogus."):
        KerasEstimator(bogus=1)


# ---------------------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_fit(dask_client, tmp_path_factory):
    import dask
    import dask.dataframe as dd

    from hora.dask import KerasEstimator
    from hora.store import Store
    from tests.tensorflow.keras_models import ScaledDense, digits_mlp

    pdf, x, y = digits_frame()
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=4)
    store = Store.create(str(tmp_path_factory.mktemp("keras-dask-store")))
    est = KerasEstimator(num_proc=2, store=store, model=digits_mlp(custom=True),
                         optimizer=keras.optimizers.Adam(0.003),
                         loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"],
                         feature_cols=["features"], label_cols=["label"], batch_size=32, epochs=3,
                         validation=0.2, random_seed=2, verbose=0, custom_objects={"ScaledDense": ScaledDense})
    model = est.fit(ddf)
    return est, model, pdf, ddf, x, y


def test_dask_fit_transform_predict(dask_fit):
    from hora.dask import KerasModel as DaskKerasModel

    est, model, pdf, ddf, x, y = dask_fit
    assert isinstance(model, DaskKerasModel)
    assert model.task_ == "classification" and model.classes_.tolist() == list(range(10))
    assert len(model.history_) == 3 and model.history_[-1]["loss"] < model.history_[0]["loss"]
    assert any(type(layer).__name__ == "ScaledDense" for layer in model.model_.layers)
    out = model.transform(ddf).compute()
    probs = np.stack(out["probability"].to_numpy())  # a classifier (sparse_categorical_crossentropy)
    assert probs.shape == (len(pdf), 10)
    assert (probs.argmax(axis=1) == out["label"].to_numpy()).mean() > 0.8
    np.testing.assert_allclose(probs[:20], model.model_.predict(x[:20], verbose=0), rtol=1e-4, atol=1e-5)
    pred = model.predict(pdf.head(20))
    np.testing.assert_allclose(model.predict_proba(pdf.head(20)), probs[:20], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pred.to_numpy(), model.classes_[probs[:20].argmax(axis=1)])


def test_dask_save_load_and_params(dask_fit, tmp_path):
    from hora.dask import KerasModel

    est, model, pdf, *_ = dask_fit
    for url in (f"file://{tmp_path}/m", "memory://hora-keras-tests/m"):
        model.save(url)
        loaded = KerasModel.load(url)  # the custom layer comes back through the saved custom_objects
        assert loaded.history_ == model.history_
        assert loaded.task_ == "classification"
        a = np.stack(loaded.transform(pdf.head(25))["probability"].to_numpy())
        b = np.stack(model.transform(pdf.head(25))["probability"].to_numpy())
        np.testing.assert_allclose(a, b, rtol=1e-6)
    params = est.get_params()
    assert "custom_objects" in params and params["epochs"] == 3
    assert est.set_params(epochs=5) is est and est.epochs == 5
    with pytest.raises(ConfigError, match="custom_objects must be a dict"):
        est.set_params(custom_objects=["ScaledDense"])._config()
    est.set_params(custom_objects={"ScaledDense": params["custom_objects"]["ScaledDense"]}, epochs=3)


# ---------------------------------------------------------------------------------------
# Keras workers read their batches through the store reader's tf.data adapter
# ---------------------------------------------------------------------------------------
from hora.estimators.callbacks import Callback  # noqa: E402


class AdapterProbe(Callback):
    """Per rank and epoch: batches the tf.data adapter served (per split) and training steps the loop took."""

    def on_epoch_begin(self, ctx, epoch):
        from hora.store.tf_adapter import batches_served

        self._before, self._steps = batches_served(), 0

    def on_batch_end(self, ctx, step, logs):
        self._steps += 1

    def on_epoch_end(self, ctx, epoch, logs):
        from hora.store.tf_adapter import batches_served

        after = batches_served()
        served = {s: after.get(s, 0) - self._before.get(s, 0) for s in ("train", "val")}
        ctx.store.write_json(ctx.store.layout.run_dir(ctx.run_id) + f"/probe-{ctx.rank}-{epoch}.json",
                             {"steps": self._steps, **served})


def _to_zero_labels(batch):
    # float64 features (the adapter's map casts them to float32) and every label 0
    return {**batch, "features": batch["features"].astype("float64"), "label": np.zeros_like(batch["label"])}


def test_keras_workers_read_batches_through_tf_adapter(tmp_path):
    from hora.dask import KerasEstimator
    from hora.store import Store
    from tests.tensorflow.keras_models import digits_mlp

    pdf, x, y = digits_frame(600)
    pdf["w"] = np.where(y % 2 == 0, 1.0, 0.5)
    pdf["is_val"] = np.arange(len(pdf)) % 5 == 0  # exactly 120 validation rows, 480 training rows
    store = Store.create(str(tmp_path / "store"))
    model = KerasEstimator(num_proc=2, store=store, model=digits_mlp(), optimizer=keras.optimizers.Adam(0.003),
                           loss="sparse_categorical_crossentropy", metrics=["accuracy"], feature_cols=["features"],
                           label_cols=["label"], sample_weight_col="w", batch_size=32, epochs=2, validation="is_val",
                           random_seed=4, verbose=0, run_id="adapter", callbacks=[AdapterProbe()],
                           transformation_fn=_to_zero_labels).fit(pdf)
    run_dir = store.layout.run_dir("adapter")
    for epoch in (0, 1):
        r0, r1 = (store.read_json(f"{run_dir}/probe-{rank}-{epoch}.json") for rank in (0, 1))
        # every trained batch came out of the adapter, none dropped or added, the same count on both ranks
        assert r0["steps"] > 0 and r0["train"] == r0["steps"], r0
        assert r0["val"] > 0 and r1 == r0, (r0, r1)
    # 480 training rows, 240 per rank: ceil(240 / 32) batches
    assert r0["steps"] == 8
    # the transformation_fn ran inside the adapter on train and val batches: all labels are 0
    assert model.history_[-1]["val_accuracy"] > 0.95


def test_keras_batches_hook_shapes_tensors_for_the_model(tmp_path, hora_single):
    import tensorflow as tf

    from hora.estimators.frameworks.keras.session import KerasSession
    from hora.store import Store, make_reader, materialize
    from hora.store.tf_adapter import batches_served

    rng = np.random.default_rng(0)
    pdf = digits_frame(50)[0]
    pdf["features"] = [row.astype("float64") for row in pdf["features"]]
    pdf["w"] = rng.random(50)
    store = Store.create(str(tmp_path / "store"))
    info = materialize(pdf, store, feature_cols=["features"], label_cols=["label"], sample_weight_col="w",
                       vector_dtype="float64")
    reader = make_reader(store, info, batch_size=16, shuffle=False)
    inputs = keras.Input((1, 8, 8))
    net = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(inputs)))
    state = KerasSession(hvd=None, model=net, optimizer=None, feature_keys=("features",), label_cols=("label",),
                         sample_weight_col="w", input_shapes=[[-1, 1, 8, 8]], output_shapes=[(1,)])
    before = batches_served().get("train", 0)
    got = list(state.batches(reader, None))
    assert len(got) == len(reader) == 4 and batches_served()["train"] - before == 4
    x, y, w = got[0]
    assert isinstance(x, tf.Tensor) and x.dtype == tf.float32 and tuple(x.shape) == (16, 1, 8, 8)
    assert tuple(y.shape) == (16, 1) and w.dtype == tf.float32 and tuple(w.shape) == (16,)
    assert [int(b[0].shape[0]) for b in got] == [16, 16, 16, 2]
    bad = KerasSession(hvd=None, model=net, optimizer=None, feature_keys=("features",), label_cols=("label",),
                       sample_weight_col=None, input_shapes=[[-1, 1, 7, 7]], output_shapes=[(1,)])
    with pytest.raises(DataError, match="features"):
        bad.batches(reader, None)
    wrong = KerasSession(hvd=None, model=net, optimizer=None, feature_keys=("features",), label_cols=("label",),
                         sample_weight_col=None, input_shapes=None, output_shapes=[(2, 2)])
    with pytest.raises(ConfigError, match="label 'label'"):
        wrong.batches(reader, None)


def _small_reader(tmp_path):
    from hora.store import Store, make_reader, materialize

    store = Store.create(str(tmp_path / "store"))
    info = materialize(digits_frame(50)[0], store, feature_cols=["features"], label_cols=["label"])
    return make_reader(store, info, batch_size=16, shuffle=False)


def test_keras_batches_hook_reraises_the_readers_own_error(tmp_path, hora_single):
    from hora.errors import StoreError
    from hora.estimators.frameworks.keras.session import KerasSession

    reader = _small_reader(tmp_path)
    inputs = keras.Input((64,))
    net = keras.Model(inputs, keras.layers.Dense(10)(inputs))
    state = KerasSession(hvd=hora_single, model=net, optimizer=None, feature_keys=("features",),
                         label_cols=("label",), sample_weight_col=None, input_shapes=None, output_shapes=[(10,)])

    def fail_on_last(batch):
        if len(batch["label"]) == 2:  # the last batch of 50 rows by 16
            raise StoreError("boom on the last batch")
        return batch

    got = []
    with pytest.raises(StoreError, match="boom on the last batch"):  # not a bare tf OpError
        for batch in state.batches(reader, fail_on_last):
            got.append(batch)
    assert len(got) == 3


def test_worker_refuses_a_batches_hook_that_drops_a_batch(tmp_path):
    import types

    from hora.estimators.framework import TrainingSession
    from hora.estimators.worker.loop import rank_batches

    reader = _small_reader(tmp_path)

    class DropsLast(TrainingSession):
        def batches(self, reader, transform):
            return list(reader)[:-1]

    from hora.estimators.data.frames import Features

    config = types.SimpleNamespace(batch_size=16, val_batch=16, seed=0, shuffle=False, shuffle_buffer_size=None,
                                   features=Features.parse(["features"]), max_length=None, on_decode_error="raise",
                                   truncation=True, sparse_format="csr")
    spec = types.SimpleNamespace(store=reader.store, dataset=reader.info, config=config, common=None)
    assert len(list(rank_batches(spec, TrainingSession(), None, "train", 0, 1, 0, None))) == 4
    with pytest.raises(DataError, match="DropsLast.batches gave 3 batches .* holds 4"):
        list(rank_batches(spec, DropsLast(), None, "train", 0, 1, 0, None))
