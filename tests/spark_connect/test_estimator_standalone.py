"""An estimator's fit / transform / save / load on a real Spark standalone cluster (a master and two
2-core workers on 127.0.0.1 and 127.0.0.2), through a Spark Connect server whose master is that
cluster: the demo's digits CNN, one 2-CPU training task per worker (the stage's ResourceProfile)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.spark_clusters import connect_mode

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _digits_cnn():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.1), torch.nn.Linear(32 * 4 * 4, 10),
    )


def _accuracy(output, label):
    return (output.argmax(dim=1) == label).float().mean()


@pytest.mark.timeout(900)
def test_digits_fit_transform_save_load_on_two_hosts(standalone_connect, tmp_path):
    import torch
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from sklearn.datasets import load_digits

    from hora.spark import TorchEstimator, TorchModel
    from hora.store import Store

    server, spark = standalone_connect
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float64"), digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    test_idx, train_idx = order[: len(y) // 5], order[len(y) // 5:]
    with connect_mode(spark):
        def frame(idx):
            pdf = pd.DataFrame({"pixels": list(x[idx]), "label": y[idx]})
            return spark.createDataFrame(pdf).select(array_to_vector("pixels").alias("features"), "label")

        net = _digits_cnn()
        est = TorchEstimator(
            num_proc=2, task_cpus=2, store=Store.create(str(tmp_path / "store")), model=net,
            optimizer=torch.optim.Adam(net.parameters(), lr=1e-3), loss=torch.nn.CrossEntropyLoss(),
            metrics={"accuracy": _accuracy}, feature_cols=["features"], label_cols=["label"],
            input_shapes=[[-1, 1, 8, 8]], batch_size=32, epochs=8, validation=0.2, random_seed=0, verbose=0,
            run_id="standalone-digits", start_timeout=180)
        model = est.fit(frame(train_idx))
        assert model.getHistory()[-1]["val_accuracy"] >= 0.93
        print("standalone digits:", model.getHistory()[-1], model.fit_timings_)

        path = str(tmp_path / "digits-model")
        model.write().overwrite().save(path)
        loaded = TorchModel.load(path)
        scored = loaded.transform(frame(test_idx))  # a classifier (CrossEntropyLoss): prediction is the class
        accuracy = scored.select(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]
        assert accuracy >= 0.93

    # the training stage asked for 2 CPUs per task (task_cpus), so its 2 tasks took one 2-core worker each
    events = [json.loads(line) for line in server.event_log_text().splitlines() if line.startswith("{")]
    profiles = {e["Resource Profile Id"]: e["Task Resource Requests"]
                for e in events if e["Event"] == "SparkListenerResourceProfileAdded"}
    job = next(e for e in events if e["Event"] == "SparkListenerJobStart"
               and "hora-train-standalone-digits" in e["Properties"].get("spark.job.tags", ""))
    assert profiles[job["Stage Infos"][0]["Resource Profile Id"]]["cpus"]["Amount"] == 2.0
    stage_id = job["Stage Infos"][0]["Stage ID"]
    hosts = {e["Task Info"]["Host"] for e in events if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] == stage_id}
    assert hosts == {"127.0.0.1", "127.0.0.2"}
