"""The first fit in a fresh Python vs the second (warm) one: the worker job's fixed costs.

Each repeat is a fresh Python process (``--child``) that starts Spark ``local[2]``, writes
``--rows`` x ``--cols`` random floats to Parquet and fits a small MLP twice on 2 ranks. For
each fit it reports the worker job's time (``fit_timings_["train_s"]``: from starting the
ranks to their results), the epochs inside it (``epochs_s``) and the difference: the
fixed costs (rank start, imports, rendezvous, engine start, reader open). The parent
prints the medians over the repeats as a Markdown table.

    .venv/bin/python benchmarks/bench_first_fit.py --rows 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def child(rows: int, cols: int, batch_size: int) -> dict:
    """Two fits in this (fresh) process; their timings."""
    logging.basicConfig(level=logging.WARNING)
    import torch
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from hora.spark import TorchEstimator
    from hora.store import Store

    spark = (
        SparkSession.builder.master("local[2]").appName("hora-bench-first-fit")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="hora-bench-first-")
    try:
        source = os.path.join(tmp, "source")
        feats = [F.rand(seed=i) for i in range(cols)]
        (spark.range(rows, numPartitions=4).select(F.array(*feats).alias("features"))
         .withColumn("y", F.aggregate("features", F.lit(0.0), lambda acc, v: acc + v))
         .write.mode("overwrite").parquet(source))
        out = {}
        for label in ("first", "second"):
            net = torch.nn.Sequential(torch.nn.Linear(cols, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
            est = TorchEstimator(
                num_proc=2, store=Store.create(os.path.join(tmp, "store")), model=net,
                optimizer=torch.optim.SGD(net.parameters(), lr=0.01), loss=torch.nn.MSELoss(),
                feature_cols=["features"], label_cols=["y"], batch_size=batch_size, epochs=1, verbose=0,
                random_seed=0,
            )
            t0 = time.perf_counter()
            model = est.fit(spark.read.parquet(source))
            tm = dict(model.fit_timings_)
            tm["fit_s"] = time.perf_counter() - t0
            out[label] = tm
        return out
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes (medians are reported)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per fresh process")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the fresh processes (e.g. HORA_WARM_WORKERS=0); repeatable")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.rows, args.cols, args.batch_size)), flush=True)
        return
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    runs = []
    for i in range(args.repeats):
        proc = subprocess.run([sys.executable, __file__, "--child", "--rows", str(args.rows), "--cols", str(args.cols),
                               "--batch-size", str(args.batch_size)], capture_output=True, text=True,
                              timeout=args.timeout, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"repeat {i + 1} failed (exit {proc.returncode})")
        runs.append(json.loads(line[len("RESULT "):]))
        print(f"repeat {i + 1}: " + ", ".join(
            f"{k} job {r['train_s']:.2f} s epochs {r['epochs_s']:.2f} s" for k, r in runs[-1].items()), flush=True)

    def med(fit: str, key: str) -> float:
        return statistics.median(r[fit][key] for r in runs)

    print(f"\n### first vs second fit, {args.rows:,} rows x {args.cols} floats, 1 epoch, 2 ranks, Spark local[2], "
          f"median of {len(runs)} fresh process(es)" + (f", {' '.join(args.env)}" if args.env else "") + "\n")
    print("| fit | fit s | checks s | materialize s | worker job s | epochs s | job - epochs s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fixed = {}
    for fit in ("first", "second"):
        fixed[fit] = statistics.median(r[fit]["train_s"] - r[fit]["epochs_s"] for r in runs)
        print(f"| {fit} | {med(fit, 'fit_s'):.2f} | {med(fit, 'prepare_s'):.2f} | {med(fit, 'materialize_s'):.2f} | "
              f"{med(fit, 'train_s'):.2f} | {med(fit, 'epochs_s'):.2f} | {fixed[fit]:.2f} |")
    if fixed["second"] > 0:
        print(f"\nfirst fit's fixed costs / second's: {fixed['first'] / fixed['second']:.1f}x "
              f"(goal: first <= 3 s; it is {fixed['first']:.2f} s)")


if __name__ == "__main__":
    main()
