"""Materializing a Spark DataFrame against a plain ``df.write.parquet`` of the same columns.

Run: ``.venv/bin/python benchmarks/bench_materialize.py [--rows 1000000] [--cols 32]``.
Prints a markdown table. The source is a Parquet copy of random float columns, read
back with ``spark.read.parquet`` (so both sides read the same input); SparkSession
``local[2]``. Runs alternate baseline / hora and keep the best of ``--repeat``.
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

from hora.store import Store, materialize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1, help="alternating runs; the best counts (use 3 on a quiet machine)")
    ap.add_argument("--num-proc", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("hora-bench-materialize")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="hora-bench-mat-")
    cols = [f"c{i}" for i in range(args.cols)]
    src = os.path.join(tmp, "source")
    (
        spark.range(args.rows, numPartitions=4)
        .select(*[F.rand(i).cast("float").alias(c) for i, c in enumerate(cols)], F.lit("unused").alias("text"))
        .write.parquet(src)
    )
    df = spark.read.parquet(src)

    def baseline(i):
        out = os.path.join(tmp, f"plain-{i}")
        t0 = time.perf_counter()
        df.select(*cols).write.parquet(out)
        dt = time.perf_counter() - t0
        shutil.rmtree(out, ignore_errors=True)
        return dt

    def hora(i, **kw):
        root = os.path.join(tmp, f"store-{i}")
        store = Store.create(root)
        t0 = time.perf_counter()
        info = materialize(df, store, cols[:-1], cols[-1:], num_proc=args.num_proc, **kw)
        dt = time.perf_counter() - t0
        assert info.train_rows + info.val_rows == args.rows and not info.reused
        t1 = time.perf_counter()
        again = materialize(df, store, cols[:-1], cols[-1:], num_proc=args.num_proc, **kw)
        reuse = time.perf_counter() - t1
        assert again.reused
        shutil.rmtree(root, ignore_errors=True)
        return dt, reuse, info

    baseline("warm")  # JIT, page cache, Python workers
    t_base, t_hora, t_val, t_reuse = [], [], [], []
    info = None
    for i in range(args.repeat):
        t_base.append(baseline(i))
        dt, reuse, info = hora(i)
        t_hora.append(dt)
        t_reuse.append(reuse)
        dt, reuse, _ = hora(f"v{i}", validation=0.2)
        t_val.append(dt)
        t_reuse.append(reuse)
    b = min(t_base)
    print(f"\n### Materialize: Spark DataFrame, {args.rows:,} rows x {args.cols} float columns, local[2], "
          f"num_proc={args.num_proc}, best of {args.repeat}\n")
    print("| what | seconds | ratio vs baseline (lower is better) |")
    print("|---|---:|---:|")
    print(f"| baseline: df.select(cols).write.parquet | {b:.2f} | 1.00 |")
    print(f"| hora materialize, no validation | {min(t_hora):.2f} | {min(t_hora) / b:.2f} |")
    print(f"| hora materialize, validation=0.2 | {min(t_val):.2f} | {min(t_val) / b:.2f} |")
    print(f"| hora materialize again, same DataFrame (reuse) | {max(t_reuse):.3f} (worst) | {max(t_reuse) / b:.3f} |")
    print(f"\n({len(info.train_files)} train files, row groups per file: "
          f"{[len(f.row_groups) for f in info.files['train']]})")
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
