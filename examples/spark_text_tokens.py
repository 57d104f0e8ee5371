"""Text classification on variable-length token ids: an EmbeddingBag on a Spark DataFrame, 2 ranks.

    python examples/spark_text_tokens.py [--rows 4000] [--epochs 4] [--num-proc 2] [--store DIR]

The "documents" are made here (no download): each is 5-60 token ids drawn from a shared
vocabulary of 2,000 words, with a few topic words of its class mixed in. The token ids are an
``array<int>`` column whose rows have different lengths: hora stores them as Parquet lists and
pads each batch to its longest row (at most ``max_length``), giving the model the padded ids
and their mask (``feature_cols=["tokens", "tokens_mask"]``). The held-out accuracy comes from
MLlib's ``MulticlassClassificationEvaluator`` on ``transform``'s ``prediction`` column. Exits
non-zero below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import pandas as pd
import torch

VOCAB = 2000


class BagOfEmbeddings(torch.nn.Module):
    """The mean embedding of a document's real tokens (the mask weights out the padding), then a linear layer."""

    def __init__(self, vocab: int = VOCAB, dim: int = 32, classes: int = 2) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(vocab, dim, mode="sum")
        self.out = torch.nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.to(self.out.weight.dtype)
        weights = weights / weights.sum(1, keepdim=True)
        return self.out(self.bag(tokens, per_sample_weights=weights))


def documents(rows: int, seed: int = 0) -> pd.DataFrame:
    """``tokens`` (int32 ids, 5-60 per row) and ``label`` (0/1): class c mixes in words of its own topic."""
    rng = np.random.default_rng(seed)
    topics = rng.choice(np.arange(1, VOCAB), (2, 40), replace=False)
    labels = rng.integers(0, 2, rows)
    docs = []
    for c in labels:
        n = int(rng.integers(5, 61))
        words = rng.zipf(1.3, n) % (VOCAB - 1) + 1
        hits = rng.random(n) < 0.25
        words[hits] = rng.choice(topics[c], int(hits.sum()))
        docs.append(words.astype(np.int32).tolist())
    return pd.DataFrame({"tokens": docs, "label": labels.astype("float64")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--min-accuracy", type=float, default=0.85)
    args = parser.parse_args(argv)

    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import SparkSession

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("hora-text-tokens")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-text-"))

    frame = documents(args.rows)
    n_test = len(frame) // 5
    train_df = spark.createDataFrame(frame.iloc[n_test:])
    test_df = spark.createDataFrame(frame.iloc[:n_test])
    torch.manual_seed(0)
    net = BagOfEmbeddings()
    model = TorchEstimator(
        num_proc=args.num_proc, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=5e-3),
        loss=torch.nn.CrossEntropyLoss(), feature_cols=["tokens", "tokens_mask"], label_cols=["label"],
        max_length=48,  # longer documents are cut to 48 tokens (counted and logged)
        batch_size=64, epochs=args.epochs, random_seed=0, verbose=0,
    ).fit(train_df)
    scored = model.transform(test_df)
    accuracy = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction",
                                                 metricName="accuracy").evaluate(scored)
    print(f"text classification on {len(frame) - n_test} documents, {args.num_proc} ranks: "
          f"held-out accuracy {accuracy:.4f} on {n_test} documents (MulticlassClassificationEvaluator)")
    spark.stop()
    if accuracy < args.min_accuracy:
        print(f"FAILED: accuracy below {args.min_accuracy}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
