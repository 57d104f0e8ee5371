"""Classification as MLlib and scikit-learn expect it: the task inferred from the loss,
rawPrediction / probability / prediction on Spark with the real MLlib evaluators (CrossValidator: test_spark_face.py),
predict / predict_proba / classes_ on Dask, persisted tasks, and a classifier's bad labels refused on
the driver."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from hora.errors import ConfigError, DataError

pytestmark = [pytest.mark.timeout(900)]

NAMES = ["setosa", "versicolor", "virginica"]


def three_classes(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """Columns a, b, c, d (floats) and a string ``species`` that a small MLP separates well."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    centers = np.array([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
    x = (centers[y] + rng.normal(scale=0.5, size=(n, 4))).astype("float32")
    pdf = pd.DataFrame(x, columns=list("abcd"))
    pdf["species"] = [NAMES[i] for i in y]
    pdf["y"] = y.astype("float64")
    return pdf


def net(out: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, out))


def _spark_estimator(store, out=3, loss=None, **kw):
    from hora.spark import TorchEstimator

    model = net(out)
    args = dict(num_proc=2, store=store, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.02),
                loss=loss if loss is not None else torch.nn.CrossEntropyLoss(), feature_cols=["features"],
                label_cols=["label"], batch_size=16, epochs=4, random_seed=1, verbose=0, lr_scaling="none")
    args.update(kw)
    return TorchEstimator(**args)


# ---------------------------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------------------------
def test_head_columns_softmax_sigmoid_and_probabilities():
    from hora.estimators.tasks import ClassifierHead

    raw, prob, pred = ClassifierHead(3).columns(np.array([[1.0, 2.0, 3.0], [5.0, 0.0, 0.0]]))
    np.testing.assert_allclose(prob, torch.softmax(torch.tensor(raw), 1).numpy())
    assert pred.tolist() == [2.0, 0.0] and pred.dtype == np.float64
    raw, prob, pred = ClassifierHead(2, single=True).columns(np.array([[-1.0], [3.0]]))
    p = 1 / (1 + np.exp(-np.array([-1.0, 3.0])))
    np.testing.assert_allclose(prob, np.stack([1 - p, p], 1))
    np.testing.assert_allclose(raw, [[1.0, -1.0], [-3.0, 3.0]])
    assert pred.tolist() == [0.0, 1.0]
    # a model that outputs probabilities (BCELoss): [1 - p, p], the margin is the logit
    raw, prob, pred = ClassifierHead(2, scores="probabilities", single=True).columns(np.array([0.2, 0.9]))
    np.testing.assert_allclose(prob, [[0.8, 0.2], [0.1, 0.9]])
    np.testing.assert_allclose(raw[:, 1], np.log([0.2 / 0.8, 0.9 / 0.1]))


@pytest.mark.parametrize("loss,task", [
    (torch.nn.CrossEntropyLoss(), "classification"), (torch.nn.NLLLoss(), "classification"),
    (torch.nn.BCEWithLogitsLoss(), "classification"), (torch.nn.BCELoss(), "classification"),
    (torch.nn.MSELoss(), None), (torch.nn.functional.mse_loss, None),
])
def test_task_inferred_from_torch_losses(loss, task):
    from hora.estimators.tasks import loss_task

    assert loss_task("torch", loss)[0] == task


def test_task_inferred_from_keras_losses():
    keras = pytest.importorskip("keras")
    from hora.estimators.tasks import loss_task

    assert loss_task("keras", "sparse_categorical_crossentropy") == ("classification", "probabilities")
    assert loss_task("keras", keras.losses.SparseCategoricalCrossentropy(from_logits=True)) == (
        "classification", "logits")
    assert loss_task("keras", keras.losses.BinaryCrossentropy()) == ("classification", "probabilities")
    assert loss_task("keras", keras.losses.MeanSquaredError())[0] is None


def test_bad_task_and_column_params(tmp_path):
    from hora.dask import TorchEstimator
    from hora.store import Store

    model = net()
    common = dict(store=Store.create(str(tmp_path)), model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1),
                  loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"])
    with pytest.raises(ConfigError, match="task must be one of"):
        TorchEstimator(task="classify", **common)._config()
    with pytest.raises(ConfigError, match="must differ"):
        TorchEstimator(prediction_col="p", probability_col="p", **common)._config()
    with pytest.raises(ConfigError, match="give prediction_col or MLlib's predictionCol"):
        TorchEstimator(predictionCol="p", prediction_col="q", **common)
    assert TorchEstimator(predictionCol="cls", **common).prediction_col == "cls"


# ---------------------------------------------------------------------------------------------
# local processes (a pandas frame): the driver's checks and the fitted classifier
# ---------------------------------------------------------------------------------------------
def _pandas_fit(store, pdf, caplog=None, **kw):
    from hora.dask import TorchEstimator

    model = net(kw.pop("out", 3))
    args = dict(num_proc=1, store=store, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"], batch_size=16,
                epochs=5, random_seed=0, verbose=0)
    args.update(kw)
    return TorchEstimator(**args).fit(pdf)


def _features(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"features": list(pdf[list("abcd")].to_numpy()), "y": pdf["y"]})


def test_bad_labels_are_a_driver_side_data_error(store):
    pdf = _features(three_classes(n=120))
    pdf.loc[10:13, "y"] = 3.0  # beyond the model's 3 classes
    pdf.loc[20, "y"] = 1.5  # not an integer
    with pytest.raises(DataError) as err:
        _pandas_fit(store, pdf)
    msg = str(err.value)
    assert "'y'" in msg and "5 of 120 rows" in msg and "[0, 3)" in msg and "1.5" in msg and "3" in msg
    assert not store.exists("runs"), "no worker may start on bad labels"


def test_inferred_task_is_logged_once_and_regression_is_unchanged(store, caplog):
    pdf = _features(three_classes(n=96))
    with caplog.at_level(logging.INFO, logger="hora.estimators.tasks"):
        reg = _pandas_fit(store, pdf, out=1, loss=torch.nn.MSELoss(), epochs=1)
    inferred = [r for r in caplog.records if "inferred" in r.getMessage()]
    assert len(inferred) == 1 and "'regression'" in inferred[0].getMessage()
    assert reg.task_ == "regression" and not hasattr(reg, "classes_")
    out = reg.transform(pdf)
    assert list(out.columns) == ["features", "y", "prediction"] and out["prediction"].dtype == np.float64
    with pytest.raises(ConfigError, match="regressor"):
        reg.predict_proba(pdf)


def test_explicit_classification_needs_class_scores():
    from types import SimpleNamespace

    from hora.estimators.tasks import resolve_task

    config = SimpleNamespace(task="classification", loss=torch.nn.MSELoss(), model=None, label_cols=["y"])
    with pytest.raises(ConfigError, match=r"one score per class .*'y' has per-row shape \(2, 3\)"):
        resolve_task(config, "torch", [(2, 3)])
    assert resolve_task(config, "torch", [(1,)]).single and resolve_task(config, "torch", [(4,)]).classes == 4
    config.task = None  # several labels: the cross-entropy loss does not make a classifier
    config.loss, config.label_cols = torch.nn.CrossEntropyLoss(), ["y", "z"]
    assert resolve_task(config, "torch", [(3,), (3,)]) is None
    config.label_cols = ["y"]  # nor one-hot labels (MLlib's classifiers take class indices)
    assert resolve_task(config, "torch", [(3,)], label_shape=(3,)) is None
    assert resolve_task(config, "torch", [(3,)], label_shape=()).classes == 3


def test_binary_single_logit_on_local_processes(store):
    pdf = _features(three_classes(n=160))
    pdf["y"] = (pdf["y"] == 1).astype("float64")
    model = _pandas_fit(store, pdf, out=1, loss=torch.nn.BCEWithLogitsLoss())
    assert model.task_ == "classification" and model.classes_.tolist() == [0, 1]
    proba = model.predict_proba(pdf)
    assert proba.shape == (160, 2)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    logit = model.model_(torch.tensor(np.stack(pdf["features"]))).detach().double().numpy().ravel()
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-logit)), rtol=1e-5)
    assert (model.predict(pdf).to_numpy() == pdf["y"].to_numpy()).mean() > 0.9


# ---------------------------------------------------------------------------------------------
# Spark local[2]: MLlib's columns, evaluators, a Pipeline, save / load
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark_frame(spark):
    return spark.createDataFrame(three_classes()[["a", "b", "c", "d", "species"]])


def _pipeline(store, **kw):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    return Pipeline(stages=[StringIndexer(inputCol="species", outputCol="label"),
                            VectorAssembler(inputCols=list("abcd"), outputCol="features"),
                            _spark_estimator(store, **kw)])


@pytest.mark.spark
def test_spark_pipeline_classifier_columns_evaluator_and_save_load(spark_frame, store, tmp_path):
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType

    fitted = _pipeline(store).fit(spark_frame)
    hora_model = fitted.stages[-1]
    assert hora_model.getTask() == "classification" and hora_model.getClassifier()["classes"] == 3
    scored = fitted.transform(spark_frame)
    schema = scored.schema
    assert isinstance(schema["rawPrediction"].dataType, VectorUDT)
    assert isinstance(schema["probability"].dataType, VectorUDT)
    assert isinstance(schema["prediction"].dataType, DoubleType)
    rows = scored.select("label", "rawPrediction", "probability", "prediction").toPandas()
    raw = np.stack([v.toArray() for v in rows["rawPrediction"]])
    prob = np.stack([v.toArray() for v in rows["probability"]])
    np.testing.assert_allclose(prob, torch.softmax(torch.tensor(raw), 1).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), prob.argmax(1).astype(float))
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    assert accuracy > 0.9
    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert loaded.stages[-1].getTask() == "classification"
    again = loaded.transform(spark_frame).select("prediction", "probability").toPandas()
    np.testing.assert_array_equal(again["prediction"].to_numpy(), rows["prediction"].to_numpy())
    np.testing.assert_allclose(np.stack([v.toArray() for v in again["probability"]]), prob)
    # MLlib's setters rename the three columns
    renamed = loaded.stages[-1].copy().setPredictionCol("cls").setProbabilityCol("p").setRawPredictionCol("logits")
    cols = renamed.transform(loaded.stages[1].transform(loaded.stages[0].transform(spark_frame))).columns
    assert {"cls", "p", "logits"} <= set(cols) and "prediction" not in cols


@pytest.mark.spark
def test_spark_binary_area_under_roc_and_mllib_names(spark, store):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler

    pdf = three_classes(n=200, seed=3)
    pdf["label"] = (pdf["y"] == 2).astype("float64")
    df = VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(
        spark.createDataFrame(pdf[["a", "b", "c", "d", "label"]]))
    est = _spark_estimator(store, out=1, loss=torch.nn.BCEWithLogitsLoss(), rawPredictionCol="score",
                           probabilityCol="proba")
    model = est.fit(df)
    scored = model.transform(df)
    assert {"score", "proba", "prediction"} <= set(scored.columns)
    auc = BinaryClassificationEvaluator(rawPredictionCol="score", metricName="areaUnderROC").evaluate(scored)
    assert auc > 0.95
    proba = np.stack([v.toArray() for v in scored.select("proba").toPandas()["proba"]])
    np.testing.assert_allclose(proba.sum(1), 1.0)


# CrossValidator over a Pipeline with hora's stage last (the grid's learning rates reaching the nested stage, the
# better one winning, the best model predicting): tests/estimators/test_spark_face.py::
# test_cross_validator_grid_over_batch_size_epochs_lr, on classic and Connect; MLlib's multiclass evaluator on a
# fitted Pipeline's classifier columns: test_spark_pipeline_classifier_columns_evaluator_and_save_load.


@pytest.mark.spark
def test_spark_bad_label_is_refused_before_training(spark, store):
    from pyspark.ml.feature import VectorAssembler

    pdf = three_classes(n=80)
    pdf["label"] = pdf["y"]
    pdf.loc[:6, "label"] = 4.0
    df = VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(
        spark.createDataFrame(pdf[["a", "b", "c", "d", "label"]]))
    with pytest.raises(DataError, match=r"label column 'label': 7 of 80 rows .*\[0, 3\) \(e\.g\. 4\)"):
        _spark_estimator(store).fit(df)


# ---------------------------------------------------------------------------------------------
# Dask LocalCluster: scikit-learn's predict / predict_proba / classes_, persistence
# ---------------------------------------------------------------------------------------------
@pytest.mark.dask
def test_dask_predict_predict_proba_classes_and_save_load(dask_client, store, tmp_path):
    import dask
    import dask.dataframe as dd

    from hora.dask import TorchEstimator, TorchModel

    pdf = _features(three_classes(n=240))
    pdf["y"] = pdf["y"].astype("int64")
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=4)
    model_net = net()
    est = TorchEstimator(num_proc=2, store=store, model=model_net,
                         optimizer=torch.optim.Adam(model_net.parameters(), lr=0.02), loss=torch.nn.CrossEntropyLoss(),
                         feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=4, random_seed=0,
                         verbose=0, lr_scaling="none")
    model = est.fit(ddf)
    assert model.task_ == "classification" and model.classes_.tolist() == [0, 1, 2]
    pred = model.predict(ddf).compute()
    assert pred.dtype == np.int64 and set(pred.unique()) <= {0, 1, 2}
    assert (pred.sort_index().to_numpy() == pdf["y"].to_numpy()).mean() > 0.9
    proba = model.predict_proba(ddf).compute()
    assert proba.shape == (240, 3)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    np.testing.assert_array_equal(proba.argmax(1), model.predict(ddf).compute().to_numpy())
    model.save(str(tmp_path / "m"))
    loaded = TorchModel.load(str(tmp_path / "m"))
    assert loaded.task_ == "classification" and loaded.classes_.tolist() == [0, 1, 2]
    np.testing.assert_allclose(loaded.predict_proba(pdf), model.predict_proba(pdf))


# ---------------------------------------------------------------------------------------------
# Keras and Lightning (local processes): the same task rules
# ---------------------------------------------------------------------------------------------
# A Keras model with sparse_categorical_crossentropy and a softmax output is a classifier whose predict_proba is
# the model's own output and predict its argmax: tests/tensorflow/test_estimators.py::test_dask_fit_transform_predict
# (task_, classes_, predict_proba, predict, on 2 ranks); loss_task of the Keras losses:
# test_task_inferred_from_keras_losses.


def test_lightning_task_attribute(store):
    L = pytest.importorskip("lightning")
    import torch.nn.functional as F

    from hora.dask import LightningEstimator

    class Module(L.LightningModule):
        task = "classification"

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = net()

        def forward(self, x):
            return self.net(x.float())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch["features"]), batch["y"].long())

    pdf = _features(three_classes(n=120))
    fitted = LightningEstimator(num_proc=1, store=store, model=Module(), feature_cols=["features"], label_cols=["y"],
                                batch_size=16, epochs=3, random_seed=0, verbose=0).fit(pdf)
    assert fitted.task_ == "classification" and fitted.classes_.tolist() == [0, 1, 2]
    proba = fitted.predict_proba(pdf)
    logits = fitted.model_(torch.tensor(np.stack(pdf["features"]))).detach()
    np.testing.assert_allclose(proba, torch.softmax(logits.double(), 1).numpy(), rtol=1e-5)
    assert (fitted.predict(pdf).to_numpy() == pdf["y"].to_numpy()).mean() > 0.8


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_spark_connect_classifier_columns_and_evaluators(connect_spark, tmp_path):
    """The same columns on a Spark Connect session (array_to_vector through Connect), MLlib's evaluators through
    Connect's ML commands, and a save / load."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler

    from hora.spark import TorchModel
    from hora.store import Store
    from tests.spark_clusters import connect_mode

    pdf = three_classes(n=160, seed=5)
    pdf["label"] = (pdf["y"] == 0).astype("float64")
    with connect_mode(connect_spark):
        df = VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(
            connect_spark.createDataFrame(pdf[["a", "b", "c", "d", "label"]]))
        store = Store.create(str(tmp_path / "store"))
        model = _spark_estimator(store, out=2).fit(df)
        scored = model.transform(df)
        assert MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored) > 0.9
        assert BinaryClassificationEvaluator(metricName="areaUnderROC").evaluate(scored) > 0.95
        path = str(tmp_path / "model")
        model.write().overwrite().save(path)
        loaded = TorchModel.load(path)
        assert loaded.getTask() == "classification"
        a = loaded.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
        np.testing.assert_array_equal(a, scored.select("prediction").toPandas()["prediction"].to_numpy())
