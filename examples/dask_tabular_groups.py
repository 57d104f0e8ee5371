"""A Dask frame of scalar columns, fed to one model input through a feature group.

    python examples/dask_tabular_groups.py [--epochs 30] [--mlflow sqlite:////tmp/mlflow.db]

Tabular data arrives as many scalar columns. scikit-learn's diabetes data (442 patients,
10 columns, no download) becomes a Dask frame with Dask's default settings;
``feature_cols=[columns]`` stacks the 10 columns into one ``(rows, 10)`` input of an MLP
(``feature_cols=columns`` would call the model with 10 inputs, as Horovod does). The
predictions keep the frame's index, so they join back to the pandas rows whatever order
``dd.from_pandas`` chose. With ``--mlflow`` the run's parameters, per-epoch metrics and
the fitted model go to an MLflow tracking store.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default=None)
    parser.add_argument("--mlflow", default=None, help="an MLflow tracking URI, e.g. sqlite:////tmp/mlflow.db")
    args = parser.parse_args(argv)

    import dask.dataframe as dd
    from distributed import Client, LocalCluster
    from sklearn.datasets import load_diabetes

    from hora.dask import TorchEstimator
    from hora.estimators.callbacks import MLflowLogger
    from hora.store import Store

    data = load_diabetes(as_frame=True).frame.astype("float32")  # 10 scalar columns and "target"
    data["target"] = data["target"] / 100.0
    columns = [c for c in data.columns if c != "target"]
    data = data.sample(frac=1.0, random_state=0)  # a shuffled index, as real tables have
    test, train = data.iloc[:88], data.iloc[88:]
    store = Store.create(args.store or tempfile.mkdtemp(prefix="hora-tabular-groups-"))
    callbacks = [MLflowLogger(tracking_uri=args.mlflow, experiment="hora-examples")] if args.mlflow else []

    with LocalCluster(n_workers=args.num_proc, threads_per_worker=1, dashboard_address=":0", silence_logs=40) as cluster, \
            Client(cluster):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(len(columns), 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        est = TorchEstimator(num_proc=args.num_proc, store=store, model=net,
                             optimizer=torch.optim.Adam(net.parameters(), lr=1e-2), loss=torch.nn.MSELoss(),
                             feature_cols=[columns], label_cols=["target"], batch_size=32, epochs=args.epochs,
                             validation=0.2, random_seed=0, verbose=0, callbacks=callbacks)
        model = est.fit(dd.from_pandas(train, npartitions=4))
        pred = model.predict(dd.from_pandas(test, npartitions=2)).compute()
    scored = test.join(pred.rename("pred"))  # by index: from_pandas sorted the rows
    rmse = float(np.sqrt(((scored["pred"] - scored["target"]) ** 2).mean()))
    baseline = float(np.sqrt(((train["target"].mean() - test["target"]) ** 2).mean()))
    print(f"validation loss {model.history_[-1]['val_loss']:.4f}; test RMSE {rmse:.4f} "
          f"(predicting the mean: {baseline:.4f})")
    if callbacks:
        print(f"MLflow run {callbacks[0].run_id_} at {callbacks[0].tracking_uri_}")
    return 0 if rmse < baseline else 1


if __name__ == "__main__":
    sys.exit(main())
