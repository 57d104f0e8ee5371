"""Train a small CNN on scikit-learn's bundled digits on a Dask LocalCluster with 2 ranks.

    python examples/dask_torch_digits.py [--epochs 15] [--num-proc 2] [--store URL]

The Dask face follows scikit-learn conventions: ``TorchEstimator(...).fit(ddf)`` on the
active ``distributed.Client`` returns a fitted ``TorchModel`` with ``history_``,
``predict(ddf)`` and ``save(url)`` / ``TorchModel.load(url)`` on any Store URL.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spark_torch_digits import DigitsCNN, accuracy  # noqa: E402  (the same model as the Spark demo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args(argv)

    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster
    from sklearn.datasets import load_digits

    from hora.dask import TorchEstimator, TorchModel
    from hora.store import Store

    t0 = time.time()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    n_test = len(y) // 5
    pdf = pd.DataFrame({"features": list(x[order]), "label": y[order]})
    test_pdf, train_pdf = pdf.iloc[:n_test], pdf.iloc[n_test:]
    workdir = args.store or tempfile.mkdtemp(prefix="hora-dask-digits-")
    store = Store.create(workdir)

    with LocalCluster(n_workers=args.num_proc, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=40) as cluster, Client(cluster):
        with dask.config.set({"dataframe.convert-string": False}):  # keep array columns as objects
            train_ddf = dd.from_pandas(train_pdf, npartitions=4)
            test_ddf = dd.from_pandas(test_pdf, npartitions=2)
        torch.manual_seed(0)
        net = DigitsCNN()
        est = TorchEstimator(
            num_proc=args.num_proc, store=store, model=net,
            optimizer=torch.optim.Adam(net.parameters(), lr=1e-3), loss=torch.nn.CrossEntropyLoss(),
            metrics={"accuracy": accuracy}, feature_cols=["features"], label_cols=["label"],
            input_shapes=[[-1, 1, 8, 8]], batch_size=32, epochs=args.epochs, validation=0.2, random_seed=0,
        )
        model = est.fit(train_ddf)
        val_acc = model.history_[-1]["val_accuracy"]
        print(f"fit: validation accuracy {val_acc:.4f}, run {model.run_id_} ({time.time() - t0:.0f} s)")
        url = store.url_for("digits-model")
        model.save(url)
        loaded = TorchModel.load(url)
        predicted = loaded.predict(test_ddf).compute().to_numpy()  # a classifier (CrossEntropyLoss): class labels
        test_acc = float((predicted == test_pdf["label"].to_numpy()).mean())
        print(f"reloaded from {url}: held-out test accuracy {test_acc:.4f} ({time.time() - t0:.0f} s)")
    if min(val_acc, test_acc) < args.min_accuracy:
        print(f"FAILED: accuracy below {args.min_accuracy}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
