"""A hashed-feature sparse logistic model: MLlib's HashingTF into 2^18-dimension sparse vectors, 2 ranks.

    python examples/spark_sparse_hashed.py [--rows 4000] [--epochs 4] [--num-proc 2] [--store DIR]

Short "reviews" are made here (no download) from a vocabulary of 5,000 words where a few
words lean positive or negative; MLlib's ``HashingTF`` turns each word list into a
``SparseVector`` of 2^18 dimensions with a few dozen non-zeros. With
``compress_sparse_cols=True`` hora stores only the non-zeros (an int32 index and a float32
value each: the store's size follows them, not the dimension) and hands the model each batch
as a ``torch.sparse_csr_tensor``, which ``torch.nn.Linear`` takes as it is: a logistic
regression over 262,144 features. The held-out area under the ROC curve comes from MLlib's
``BinaryClassificationEvaluator`` on ``transform``'s ``rawPrediction``. Exits non-zero below
``--min-auc``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pandas as pd
import torch

DIM = 1 << 18
VOCAB = 5000


def reviews(rows: int, seed: int = 0) -> pd.DataFrame:
    """``words`` (10-40 words per row) and ``label`` (0/1): 60 words lean positive, 60 negative."""
    rng = np.random.default_rng(seed)
    leaning = rng.choice(VOCAB, 120, replace=False)
    positive, negative = leaning[:60], leaning[60:]
    labels = rng.integers(0, 2, rows)
    texts = []
    for c in labels:
        n = int(rng.integers(10, 41))
        words = rng.integers(0, VOCAB, n)
        hits = rng.random(n) < 0.2
        words[hits] = rng.choice(positive if c else negative, int(hits.sum()))
        texts.append([f"w{w}" for w in words])
    return pd.DataFrame({"words": texts, "label": labels.astype("float64")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--min-auc", type=float, default=0.9)
    args = parser.parse_args(argv)

    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.feature import HashingTF
    from pyspark.sql import SparkSession

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("hora-sparse-hashed")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-sparse-"))

    frame = reviews(args.rows)
    n_test = len(frame) // 5
    hashing = HashingTF(inputCol="words", outputCol="features", numFeatures=DIM)
    train_df = hashing.transform(spark.createDataFrame(frame.iloc[n_test:])).select("features", "label")
    test_df = hashing.transform(spark.createDataFrame(frame.iloc[:n_test])).select("features", "label")
    torch.manual_seed(0)
    net = torch.nn.Linear(DIM, 1)  # one logit: a logistic regression
    model = TorchEstimator(
        num_proc=args.num_proc, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-2),
        loss=torch.nn.BCEWithLogitsLoss(), feature_cols=["features"], label_cols=["label"],
        compress_sparse_cols=True, sparse_format="csr",
        batch_size=64, epochs=args.epochs, random_seed=0, verbose=0,
    ).fit(train_df)
    scored = model.transform(test_df)
    auc = BinaryClassificationEvaluator(labelCol="label", rawPredictionCol="rawPrediction",
                                        metricName="areaUnderROC").evaluate(scored)
    print(f"hashed sparse logistic model on {len(frame) - n_test} reviews (2^18 features), {args.num_proc} ranks: "
          f"held-out areaUnderROC {auc:.4f} on {n_test} reviews (BinaryClassificationEvaluator)")
    spark.stop()
    if auc < args.min_auc:
        print(f"FAILED: areaUnderROC below {args.min_auc}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
