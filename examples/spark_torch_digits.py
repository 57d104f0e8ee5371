"""hora's demo: train a small CNN on scikit-learn's bundled digits with Spark local[2] and 2 ranks.

    python examples/spark_torch_digits.py [--epochs 15] [--num-proc 2] [--store DIR]

Steps: load the 1,797 8x8 digit images (bundled with scikit-learn, no download), hold
out 20% as a test set, build a Spark DataFrame (features as an ML vector), fit
``hora.spark.TorchEstimator`` with ``num_proc=2`` (two training processes averaging
gradients with allreduce) and a 20% validation split, print the validation accuracy,
save the fitted ``TorchModel``, load it back, and score the held-out test set on the
executors. Exits non-zero if an accuracy is below the expected 0.95.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import torch


class DigitsCNN(torch.nn.Module):
    """Two conv layers and a linear head for 1x8x8 images, 10 classes (logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        )
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.1), torch.nn.Linear(32 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Share of rows whose highest logit is the label."""
    return (output.argmax(dim=1) == label).float().mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args(argv)

    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from hora.spark import TorchEstimator, TorchModel
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local[2]: keep every socket on loopback
    spark = (
        SparkSession.builder.master("local[2]").appName("hora-digits")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")  # hora draws its own progress bar
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    workdir = args.store or tempfile.mkdtemp(prefix="hora-digits-")
    store = Store.create(workdir)
    t0 = time.time()

    digits = load_digits()
    x = (digits.data / 16.0).astype("float64")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    n_test = len(y) // 5
    test_idx, train_idx = order[:n_test], order[n_test:]

    def frame(idx: np.ndarray):
        # through Arrow from pandas, then the 64 pixels as an ML vector (what VectorAssembler gives)
        pdf = pd.DataFrame({"pixels": list(x[idx]), "label": y[idx]})
        return spark.createDataFrame(pdf).select(array_to_vector("pixels").alias("features"), "label")

    train_df, test_df = frame(train_idx), frame(test_idx)
    torch.manual_seed(0)
    net = DigitsCNN()
    est = TorchEstimator(
        num_proc=args.num_proc,
        store=store,
        model=net,
        optimizer=torch.optim.Adam(net.parameters(), lr=1e-3),  # x num_proc on the workers (lr_scaling="linear")
        loss=torch.nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        feature_cols=["features"],
        label_cols=["label"],
        input_shapes=[[-1, 1, 8, 8]],
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation=0.2,
        random_seed=0,
        verbose=1,
    )
    model = est.fit(train_df)
    val_acc = model.getHistory()[-1]["val_accuracy"]
    print(f"fit: {args.epochs} epochs on {args.num_proc} ranks, run {model.getOrDefault('run_id')}, "
          f"validation accuracy {val_acc:.4f} ({time.time() - t0:.0f} s so far)")

    path = os.path.join(workdir, "digits-model")
    model.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    scored = loaded.transform(test_df)
    # CrossEntropyLoss makes a classifier: rawPrediction (logits), probability (vectors) and prediction (the class)
    test_acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    print(f"reloaded model from {path}: held-out test accuracy {test_acc:.4f} on {n_test} images "
          f"({time.time() - t0:.0f} s in total)")
    spark.stop()
    if val_acc < args.min_accuracy or test_acc < args.min_accuracy:
        print(f"FAILED: accuracy below {args.min_accuracy}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
