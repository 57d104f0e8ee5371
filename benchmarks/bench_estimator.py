"""End-to-end ``hora.spark.TorchEstimator.fit`` against a hand-written TorchDistributor + DDP script.

Run: ``.venv/bin/python benchmarks/bench_estimator.py [--rows 1000000] [--cols 32] [--epochs 3]``.

Both sides start from the same Parquet source (a ``features`` array column of
``--cols`` floats and a ``y`` column; SparkSession ``local[2]``) and train the same
regression MLP with SGD on 2 ranks for ``--epochs`` epochs at ``--batch-size`` rows per
rank and step:

* baseline: ``pyspark.ml.torch.distributor.TorchDistributor(num_processes=2,
  local_mode=False)`` runs a function that reads the Parquet files with pyarrow, takes
  a contiguous half of the rows per rank, and trains ``DistributedDataParallel`` over
  gloo (no validation, no checkpoints);
* hora: ``TorchEstimator(...).fit(spark.read.parquet(source))`` (schema checks, a
  forward pass on a sample, materialization to the store, per-epoch checkpoints).
  Measured cold (dataset materialized in the run) and warm (a second fit reuses the
  committed dataset with the same fingerprint).

Prints a markdown table with the ratio hora / baseline and where hora's time goes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def make_mlp(cols: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(cols, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 1))


def ddp_train(source: str, cols: int, epochs: int, batch_size: int, lr: float) -> dict:
    """The baseline's per-rank function (run by TorchDistributor)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    table = pq.read_table(source, columns=["features", "y"])
    n = table.num_rows
    x = pc.list_flatten(table.column("features")).to_numpy().astype("float32").reshape(n, cols)
    y = table.column("y").to_numpy().astype("float32").reshape(n, 1)
    share = n // size
    x, y = torch.from_numpy(x[rank * share:(rank + 1) * share]), torch.from_numpy(y[rank * share:(rank + 1) * share])
    t_read = time.perf_counter() - t0
    model = torch.nn.parallel.DistributedDataParallel(make_mlp(cols))
    opt = torch.optim.SGD(model.parameters(), lr=lr * size)
    loss_fn = torch.nn.MSELoss()
    t1 = time.perf_counter()
    for epoch in range(epochs):
        order = torch.from_numpy(np.random.default_rng(epoch).permutation(share))
        for start in range(0, share, batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    t_train = time.perf_counter() - t1
    dist.destroy_process_group()
    return {"read_s": t_read, "epochs_s": t_train, "loss": float(loss.detach())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from hora.spark import TorchEstimator
    from hora.store import Store

    spark = (
        SparkSession.builder.master("local[2]").appName("hora-bench-estimator")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="hora-bench-est-")
    source = os.path.join(tmp, "source")
    feats = [F.rand(seed=i) for i in range(args.cols)]
    (spark.range(args.rows, numPartitions=4)
     .select(F.array(*feats).alias("features"))
     .withColumn("y", F.aggregate("features", F.lit(0.0), lambda acc, v: acc + v))
     .write.mode("overwrite").parquet(source))

    # baseline: TorchDistributor + DDP reading the Parquet with pyarrow
    t0 = time.perf_counter()
    base = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        ddp_train, source, args.cols, args.epochs, args.batch_size, args.lr)
    t_base = time.perf_counter() - t0

    rows = []
    for label in ("hora cold", "hora warm"):
        net = make_mlp(args.cols)
        est = TorchEstimator(
            num_proc=2, store=Store.create(os.path.join(tmp, "store")), model=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=args.lr), loss=torch.nn.MSELoss(),
            feature_cols=["features"], label_cols=["y"], batch_size=args.batch_size, epochs=args.epochs,
            shuffle=True, verbose=0, random_seed=0,
        )
        t0 = time.perf_counter()
        model = est.fit(spark.read.parquet(source))
        elapsed = time.perf_counter() - t0
        rows.append((label, elapsed, model.fit_timings_, model.getHistory()[-1]["loss"]))

    print(f"\n### fit, {args.rows:,} rows x {args.cols} features, 2 ranks, {args.epochs} epochs, "
          f"batch {args.batch_size}, Spark local[2]\n")
    print("| run | seconds | ratio to baseline | where the time goes | final train loss |")
    print("|---|---:|---:|---|---:|")
    print(f"| TorchDistributor + DDP (baseline) | {t_base:.1f} | 1.00 | read {base['read_s']:.1f} s, "
          f"epochs {base['epochs_s']:.1f} s, rest = launch | {base['loss']:.4g} |")
    for label, elapsed, tm, loss in rows:
        where = (f"checks {tm.get('prepare_s', 0):.1f} s, materialize {tm.get('materialize_s', 0):.1f} s, "
                 f"worker job {tm.get('train_s', 0):.1f} s (epochs {tm.get('epochs_s', 0):.1f} s), "
                 f"collect {tm.get('collect_s', 0):.1f} s")
        print(f"| {label} | {elapsed:.1f} | {elapsed / t_base:.2f} | {where} | {loss:.4g} |")
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
