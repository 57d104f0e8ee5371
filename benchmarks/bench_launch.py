"""Launch overhead of hora.runners.run per backend, next to Spark's TorchDistributor.

Launch overhead = from the driver's call (``run()`` / ``TorchDistributor.run``) until
*every* rank is inside the training function. Each rank writes ``time.time()`` to a file
on entry (all ranks run on this machine, so the clocks agree). For hora this includes
``hora.native.init()`` (the ranks are ready for collectives); the TorchDistributor
function does nothing, so the comparison is conservative for hora.

    python benchmarks/bench_launch.py [--repeats 3] [--skip-torch-distributor]

Prints a markdown table with the median of ``--repeats`` runs (after one warm-up run
per backend) and each backend's ratio to TorchDistributor on the same SparkSession.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _mark_entry(out_dir: str) -> None:
    import os as _os
    import time as _time

    rank = _os.environ.get("HORA_RANK") or _os.environ.get("RANK") or "0"
    with open(_os.path.join(out_dir, f"rank.{rank}"), "w") as fh:
        fh.write(repr(_time.time()))


def _launch_time(start: float, out_dir: str, n: int) -> float:
    stamps = []
    for r in range(n):
        with open(os.path.join(out_dir, f"rank.{r}")) as fh:
            stamps.append(float(fh.read()))
    return max(stamps) - start


def _measure(launch, n: int, repeats: int) -> list[float]:
    times = []
    for i in range(repeats + 1):
        out_dir = tempfile.mkdtemp(prefix="hora-bench-launch-")
        start = time.time()
        launch(out_dir)
        t = _launch_time(start, out_dir, n)
        if i > 0:  # the first run warms up workers and imports
            times.append(t)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", "--num-proc", type=int, default=2)
    parser.add_argument("--skip-torch-distributor", action="store_true")
    args = parser.parse_args()
    n = args.num_proc

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import hora.runners as hr

    results: dict[str, list[float]] = {}
    from distributed import Client, LocalCluster
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{n}]")
        .appName("hora-bench-launch")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if not args.skip_torch_distributor:
            from pyspark.ml.torch.distributor import TorchDistributor

            results["TorchDistributor(local_mode=False)"] = _measure(
                lambda d: TorchDistributor(num_processes=n, local_mode=False, use_gpu=False).run(_mark_entry, d),
                n, args.repeats,
            )
        results["hora spark"] = _measure(
            lambda d: hr.run(_mark_entry, args=(d,), num_proc=n, backend="spark", spark=spark, verbose=0), n, args.repeats
        )
    finally:
        spark.stop()
    results["hora local"] = _measure(
        lambda d: hr.run(_mark_entry, args=(d,), num_proc=n, backend="local", verbose=0), n, args.repeats
    )
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0")
    client = Client(cluster)
    try:
        results["hora dask"] = _measure(
            lambda d: hr.run(_mark_entry, args=(d,), num_proc=n, backend="dask", client=client, verbose=0), n, args.repeats
        )
    finally:
        client.close()
        cluster.close()

    base = results.get("TorchDistributor(local_mode=False)")
    base_median = statistics.median(base) if base else None
    print(f"\nLaunch overhead, {n} ranks, median of {args.repeats} (after a warm-up), this machine:\n")
    print("| launcher | median s | runs s | ratio vs TorchDistributor |")
    print("|---|---|---|---|")
    for name, times in results.items():
        med = statistics.median(times)
        ratio = f"{med / base_median:.2f}" if base_median else "n/a"
        print(f"| {name} | {med:.2f} | {', '.join(f'{t:.2f}' for t in times)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
