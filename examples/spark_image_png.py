"""An image CNN on a binary column of PNGs: scikit-learn's digits as PNG bytes in a Spark DataFrame, 2 ranks.

    python examples/spark_image_png.py [--epochs 8] [--num-proc 2] [--rows 1797] [--store DIR]

The 1,797 8x8 digits bundled with scikit-learn (no download) are scaled to 16x16 and encoded
as PNG with Pillow: the DataFrame holds a ``binary`` column of PNG bytes, as a table of images
would. hora stores the bytes as they are and decodes them on the ranks, in the reader's
background thread while the previous batch trains (``hora.store.decode_image``: an
``(N, 16, 16, 1)`` uint8 batch). The held-out accuracy comes from MLlib's
``MulticlassClassificationEvaluator`` on ``transform``'s ``prediction`` (which decodes the same
way). Exits non-zero below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile

import numpy as np
import pandas as pd
import torch


class PngDigitsCNN(torch.nn.Module):
    """Decoded PNGs (N, 16, 16, 1) uint8 -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(image.permute(0, 3, 1, 2).float() / 255.0)


def png_digits(rows: int | None = None) -> pd.DataFrame:
    """``image`` (PNG bytes of a 16x16 grayscale digit) and ``label`` (0-9)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images[:rows], digits.target[:rows]
    pngs = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray((img * 255 / 16).astype(np.uint8)).resize((16, 16)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    return pd.DataFrame({"image": pngs, "label": labels.astype("float64")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--rows", type=int, default=None, help="use the first ROWS digits (default: all 1,797)")
    parser.add_argument("--store", default=None, help="store URL or folder (default: a temporary folder)")
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    args = parser.parse_args(argv)

    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import SparkSession

    from hora.spark import TorchEstimator
    from hora.store import Store

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("hora-png-digits")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-png-"))

    frame = png_digits(args.rows).sample(frac=1.0, random_state=0)
    n_test = len(frame) // 5
    train_df = spark.createDataFrame(frame.iloc[n_test:])  # image: BinaryType
    test_df = spark.createDataFrame(frame.iloc[:n_test])
    torch.manual_seed(0)
    net = PngDigitsCNN()
    model = TorchEstimator(
        num_proc=args.num_proc, store=store, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=2e-3),
        loss=torch.nn.CrossEntropyLoss(), feature_cols=["image"], label_cols=["label"],
        batch_size=32, epochs=args.epochs, random_seed=0, verbose=0,
    ).fit(train_df)
    scored = model.transform(test_df)
    accuracy = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction",
                                                 metricName="accuracy").evaluate(scored)
    print(f"PNG digits CNN on {len(frame) - n_test} images, {args.num_proc} ranks: held-out accuracy "
          f"{accuracy:.4f} on {n_test} images (MulticlassClassificationEvaluator)")
    spark.stop()
    if accuracy < args.min_accuracy:
        print(f"FAILED: accuracy below {args.min_accuracy}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
