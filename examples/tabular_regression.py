"""Tabular regression in an MLlib Pipeline: VectorAssembler -> StandardScaler -> hora TorchEstimator.

    python examples/tabular_regression.py [--epochs 20]

Uses scikit-learn's bundled diabetes data (442 patients, 10 features, no download),
tunes the learning rate with ``TrainValidationSplit`` over a ``ParamGridBuilder``
grid, saves and reloads the best ``PipelineModel`` and compares its test RMSE with
predicting the training mean.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None)
    args = parser.parse_args(argv)

    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_diabetes

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local[2]: keep every socket on loopback
    spark = (SparkSession.builder.master("local[2]").appName("hora-tabular")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    workdir = args.store or tempfile.mkdtemp(prefix="hora-tabular-")

    data = load_diabetes(as_frame=True).frame  # 10 feature columns and "target"
    data["target"] = data["target"] / 100.0
    df = spark.createDataFrame(data)
    train, test = df.randomSplit([0.8, 0.2], seed=1)
    feature_names = [c for c in data.columns if c != "target"]

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    est = TorchEstimator(
        num_proc=args.num_proc, store=Store.create(workdir), model=net,
        optimizer=torch.optim.Adam(net.parameters(), lr=1e-3), loss=torch.nn.MSELoss(),
        feature_cols=["features"], label_cols=["target"], batch_size=32, epochs=args.epochs, verbose=0,
    )
    pipeline = Pipeline(stages=[
        VectorAssembler(inputCols=feature_names, outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True),
        est,
    ])
    grid = ParamGridBuilder().addGrid(est.learning_rate, [1e-3, 1e-2]).build()
    evaluator = RegressionEvaluator(labelCol="target", predictionCol="prediction", metricName="rmse")
    tvs = TrainValidationSplit(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, trainRatio=0.75, seed=2)
    tuned = tvs.fit(train)
    for params, rmse in zip(grid, tuned.validationMetrics):
        print(f"learning_rate={list(params.values())[0]:g}: validation RMSE {rmse:.4f}")
    best = tuned.bestModel
    path = os.path.join(workdir, "pipeline")
    best.write().overwrite().save(path)
    reloaded = PipelineModel.load(path)
    rmse = evaluator.evaluate(reloaded.transform(test))
    mean = train.agg({"target": "avg"}).first()[0]
    baseline = float(np.sqrt(test.selectExpr(f"avg(pow(target - {mean}, 2))").first()[0]))
    print(f"test RMSE {rmse:.4f} (predicting the mean: {baseline:.4f})")
    spark.stop()
    return 0 if rmse < baseline else 1


if __name__ == "__main__":
    sys.exit(main())
