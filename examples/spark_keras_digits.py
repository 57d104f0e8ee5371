"""Train a Keras 3 CNN on scikit-learn's digits in a Spark DataFrame with ``hora.spark.KerasEstimator``.

::

    python examples/spark_keras_digits.py --num-proc 2 --epochs 5

A local SparkSession (``local[N]``) holds the 8x8 digits (bundled with scikit-learn, no
download); the estimator materializes them to Parquet in a Store, trains on
``--num-proc`` ranks with averaged gradients, and returns a Spark ML Model whose
``transform`` scores the DataFrame on the executors. The model is saved and loaded
back, and both copies must predict alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter (with hora installed)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from hora.spark import KerasEstimator, KerasModel  # noqa: E402
from hora.store import Store  # noqa: E402


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.002, help="per-rank learning rate (scaled by num-proc)")
    p.add_argument("--store", default=None, help="Store URL (default: a fresh temporary directory)")
    args = p.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: keep every socket on loopback
    spark = (SparkSession.builder.master(f"local[{args.num_proc}]").appName("hora-keras-digits")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        digits = load_digits()
        rows = [([float(v) for v in img], int(label)) for img, label in zip(digits.data / 16.0, digits.target)]
        df = spark.createDataFrame(rows, "features array<float>, label long")
        train, test = df.randomSplit([0.8, 0.2], seed=0)

        store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-keras-store-"))
        keras.utils.set_random_seed(0)
        est = KerasEstimator(
            num_proc=args.num_proc, store=store, model=build_model(),
            optimizer=keras.optimizers.Adam(args.lr), loss="sparse_categorical_crossentropy",
            metrics=["accuracy"], feature_cols=["features"], label_cols=["label"],
            input_shapes=[[-1, 8, 8, 1]], batch_size=args.batch_size, epochs=args.epochs, validation=0.1,
            random_seed=0, verbose=1,
        )
        model = est.fit(train)
        for h in model.getHistory():
            print(f"epoch {h['epoch'] + 1}: loss {h['loss']:.4f}  val_loss {h['val_loss']:.4f}  "
                  f"val_accuracy {h['val_accuracy']:.3f}")

        # sparse_categorical_crossentropy makes a classifier: probability vectors and the class as prediction
        scored = model.transform(test).select("label", "probability", "prediction").toPandas()
        probs = np.stack([v.toArray() for v in scored["probability"]])
        accuracy = float((scored["prediction"].to_numpy() == scored["label"].to_numpy()).mean())
        print(f"test accuracy on {len(scored)} rows (scored on the executors): {accuracy:.3f}")

        path = os.path.join(tempfile.mkdtemp(prefix="hora-keras-model-"), "model")
        model.write().overwrite().save(path)
        again = KerasModel.load(path)
        probs2 = np.stack([v.toArray() for v in again.transform(test).select("probability").toPandas()["probability"]])
        same = bool(np.allclose(probs, probs2, atol=1e-6))
        print(f"saved to {path}; the loaded model predicts the same: {same}")
        if not same:
            raise SystemExit("the loaded model predicts differently")
        return {"history": model.getHistory(), "test_accuracy": accuracy, "path": path}
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
