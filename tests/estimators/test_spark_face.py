"""hora.spark.TorchEstimator / TorchModel with 2 ranks, on the classic session (local[2]) and on a Spark
Connect session (a real Connect server, local[2]): every test runs on both, with the same assertions.

On the Connect session the tests run in :func:`tests.spark_clusters.connect_mode`, as a Connect-only
process would: pyspark.ml's own stages (VectorAssembler, StandardScaler, RegressionEvaluator) and the
Pipeline / CrossValidator readers and writers go through Spark Connect's ML commands, while hora's
stages are custom Python stages in the same Pipeline.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.estimators.frames import mlp, regression_columns
from tests.spark_clusters import connect_mode

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", params=["classic", "connect"])
def session(request):
    """The classic ``spark`` session, then the Connect ``connect_spark`` session."""
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


@pytest.fixture(autouse=True)
def _session_mode(session):
    with connect_mode(session):
        yield


def _frame(spark, n=320, seed=0):
    return spark.createDataFrame(regression_columns(n=n, seed=seed))


def _estimator(store, **kw):
    from hora.spark import TorchEstimator

    net = mlp()
    args = dict(
        num_proc=2, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"], batch_size=32,
        epochs=2, validation=0.25, random_seed=3, verbose=0,
    )
    args.update(kw)
    return TorchEstimator(**args)


@pytest.fixture(scope="module")
def spark_fit(session, tmp_path_factory):
    from pyspark.ml.feature import VectorAssembler

    from hora.store import Store

    with connect_mode(session):
        store = Store.create(str(tmp_path_factory.mktemp("spark-store")))
        df = VectorAssembler(inputCols=list("abcd"), outputCol="features").transform(_frame(session))
        est = _estimator(store, metrics={"mae": torch.nn.functional.l1_loss})
        model = est.fit(df)
    return est, model, df, store


def test_fit_history_and_run(spark_fit):
    est, model, df, store = spark_fit
    hist = model.getHistory()
    assert [h["epoch"] for h in hist] == [0, 1]
    assert {"loss", "val_loss", "val_mae"} <= set(hist[0])
    assert hist[-1]["val_loss"] < hist[0]["val_loss"]
    assert model.history_ == hist
    run_id = model.getOrDefault("run_id")
    assert store.list_checkpoints(run_id) == [0, 1]
    assert any("tfevents" in p for p in store.listdir(store.layout.logs_dir(run_id)))
    fig = model.plot_history()
    assert [ax.get_title() for ax in fig.axes] == ["loss", "mae"]


def test_transform_batched_on_executors(spark_fit):
    est, model, df, store = spark_fit
    out = model.transform(df)
    assert out.columns == df.columns + ["prediction"]
    assert dict(out.dtypes)["prediction"] == "double"
    pdf = out.select("a", "b", "c", "d", "prediction").toPandas()
    x = torch.tensor(pdf[list("abcd")].to_numpy(), dtype=torch.float32)
    expected = model.getModel()(x).detach().numpy().ravel()
    np.testing.assert_allclose(pdf["prediction"].to_numpy(), expected, rtol=1e-5, atol=1e-5)


def test_save_load_predicts_the_same(spark_fit, tmp_path):
    from hora.spark import TorchEstimator, TorchModel

    est, model, df, store = spark_fit
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    model.write().overwrite().save(path)  # overwrite clears what is there (on Connect: on the server)
    loaded = TorchModel.load(path)
    assert loaded.uid == model.uid and loaded.getHistory() == model.getHistory()
    a = loaded.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    b = model.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(a, b)
    est_path = str(tmp_path / "est")
    est.write().overwrite().save(est_path)
    est2 = TorchEstimator.load(est_path)
    assert est2.getBatchSize() == 32 and est2.getLabelCols() == ["y"]
    assert isinstance(est2.getModel(), torch.nn.Module)
    assert isinstance(est2.getOptimizer(), torch.optim.Adam)


def test_a_model_above_the_inline_limit_is_shipped_once_per_session(spark_fit, monkeypatch):
    est, model, df, store = spark_fit
    inline = model.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    monkeypatch.setenv("HORA_TRANSFORM_INLINE_BYTES", "0")  # classic: a broadcast; Connect: an artifact file
    shipped = model.copy().transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(shipped, inline)


def test_copy_semantics(spark_fit):
    est, model, df, store = spark_fit
    est2 = est.copy({est.epochs: 7})
    assert est2.getEpochs() == 7 and est.getEpochs() == 2 and est2.uid == est.uid
    m2 = model.copy({model.output_cols: ["score"]})
    assert m2.getModel() is not model.getModel()
    for p, q in zip(m2.getModel().parameters(), model.getModel().parameters()):
        assert torch.equal(p, q)
    assert "score" in m2.transform(df).columns and model.getOrDefault("output_cols") == ["prediction"]


def test_pipeline_after_assembler_and_scaler_save_load(session, tmp_path, store):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    df = _frame(session, n=256, seed=1)
    pipe = Pipeline(stages=[
        VectorAssembler(inputCols=list("abcd"), outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features"),
        _estimator(store, epochs=1, validation=None),
    ])
    fitted = pipe.fit(df)
    before = fitted.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    after = loaded.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(before, after)


def test_cross_validator_grid_over_batch_size_epochs_lr(session, store):
    """CrossValidator over a Pipeline whose last stage is hora's: the grid's params reach the nested stage."""
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    df = _frame(session, n=192, seed=2)
    est = _estimator(store, validation=None, lr_scaling="none")
    pipe = Pipeline(stages=[VectorAssembler(inputCols=list("abcd"), outputCol="features"), est])
    grid = (ParamGridBuilder().addGrid(est.batch_size, [64]).addGrid(est.epochs, [1])
            .addGrid(est.learning_rate, [1e-5, 0.05]).build())
    cv = CrossValidator(estimator=pipe, estimatorParamMaps=grid, numFolds=2, seed=7,
                        evaluator=RegressionEvaluator(labelCol="y", predictionCol="prediction", metricName="rmse"))
    cv_model = cv.fit(df)
    assert len(cv_model.avgMetrics) == 2
    # a learning rate of 1e-5 for one epoch barely moves: the larger one must win
    assert cv_model.avgMetrics[1] < cv_model.avgMetrics[0]
    assert cv_model.bestModel.transform(df).select("prediction").count() == 192


def test_transform_keeps_other_vector_columns_and_sparsity(session):
    from pyspark.ml.linalg import SparseVector, Vectors

    from hora.spark import TorchModel

    df = session.createDataFrame(
        [(Vectors.sparse(4, [1], [2.0]), Vectors.dense([1.0, 2.0]), 1.0),
         (Vectors.dense([1.0, 2.0, 3.0, 4.0]), Vectors.dense([3.0, 4.0]), 2.0)], ["v", "f", "y"])
    net = torch.nn.Linear(2, 2)
    model = TorchModel(model=net, feature_cols=["f"], label_cols=["y"], output_shapes=[[2]], output_cols=["out"])
    rows = model.transform(df).collect()
    assert dict(model.transform(df).dtypes)["out"] == "array<double>"
    assert isinstance(rows[0].v, SparseVector) and rows[0].v == Vectors.sparse(4, [1], [2.0])
    expected = net(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).detach().numpy()
    np.testing.assert_allclose(np.array([r.out for r in rows]), expected, rtol=1e-6)
