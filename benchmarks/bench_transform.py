"""``hora.spark.TorchModel.transform`` against row-at-a-time inference in ``rdd.mapPartitions``.

Run: ``.venv/bin/python benchmarks/bench_transform.py [--rows 1000000] [--cols 32]``.

Both sides score the same DataFrame (a ``features`` array column of ``--cols`` floats,
4 partitions, cached) with the same MLP, SparkSession ``local[2]``, and are forced
to completion with the ``noop`` sink:

* baseline (the way Horovod 0.28's ``TorchModel`` predicts): ``df.rdd.mapPartitions``
  deserializes the model once per partition and calls it on one row at a time,
  yielding a ``Row`` with the prediction; ``spark.createDataFrame(rdd, schema)``;
* hora: ``TorchModel.transform(df)``: ``mapInArrow`` over Arrow batches (features
  straight from Arrow to numpy), model loaded once per task, batched forward passes.

Prints a markdown table with the speed-up (baseline seconds / hora seconds).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch
    from pyspark.sql import Row, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StructField, StructType

    from hora.spark import TorchModel

    spark = (
        SparkSession.builder.master("local[2]").appName("hora-bench-transform")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.range(args.rows, numPartitions=4)
          .select(F.col("id"), F.array(*[F.rand(seed=i) for i in range(args.cols)]).alias("features"))
          .cache())
    df.count()

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(args.cols, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 1)).eval()
    hora_model = TorchModel(model=net, feature_cols=["features"], label_cols=["y"], output_shapes=[[1]])

    buf = io.BytesIO()
    torch.save(net, buf)
    model_bytes = spark.sparkContext.broadcast(buf.getvalue())

    def row_at_a_time(rows):
        import io as _io

        import torch as _torch

        model = _torch.load(_io.BytesIO(model_bytes.value), weights_only=False).eval()
        for row in rows:
            x = _torch.tensor(row.features, dtype=_torch.float32).reshape(1, -1)
            with _torch.no_grad():
                pred = model(x)
            yield Row(id=row.id, features=row.features, prediction=float(pred[0, 0]))

    schema = StructType(list(df.schema.fields) + [StructField("prediction", DoubleType(), False)])

    def run_baseline() -> float:
        t0 = time.perf_counter()
        spark.createDataFrame(df.rdd.mapPartitions(row_at_a_time), schema).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    def run_hora() -> float:
        t0 = time.perf_counter()
        hora_model.transform(df).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    # same answers first (on a slice)
    sample = df.limit(100)
    a = sorted(hora_model.transform(sample).select("id", "prediction").collect())
    b = sorted(spark.createDataFrame(sample.rdd.mapPartitions(row_at_a_time), schema).select("id", "prediction").collect())
    assert all(abs(x.prediction - y.prediction) < 1e-4 for x, y in zip(a, b)), "the two paths disagree"

    run_hora()  # warm the Python workers
    base = min(run_baseline() for _ in range(args.repeat))
    hora_s = min(run_hora() for _ in range(args.repeat))
    print(f"\n### transform, {args.rows:,} rows x {args.cols} features, MLP, Spark local[2]\n")
    print("| path | seconds | rows/s | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| rdd.mapPartitions row at a time (Horovod 0.28 way) | {base:.1f} | {args.rows / base:,.0f} | 1.0 |")
    print(f"| hora TorchModel.transform (mapInArrow, batched) | {hora_s:.1f} | {args.rows / hora_s:,.0f} | {base / hora_s:.1f} |")
    spark.stop()


if __name__ == "__main__":
    main()
