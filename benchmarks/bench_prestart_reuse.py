"""A Spark fit whose data is already materialized: no prestart job (what hora does now) against
the prestart job every fit ran before (the baseline), alternated in the same run.

Run: ``.venv/bin/python benchmarks/bench_prestart_reuse.py [--pairs 5] [--epochs 1]``. Prints a markdown
table. The fit is ``chaos_soak.py``'s (2 ranks, 256 rows, ``task_cpus=2``) on the soak's Spark
standalone cluster (a master and two 2-core workers on 127.0.0.1 and 127.0.0.2), a one-epoch fit by
default: what the soak calls the job's cold start. A first fit materializes the data (and starts
the executors' warm rank servers); then each pair runs the same fit twice, once with
``SparkLauncher.prestart_takes_slots = False`` (the fit starts the prestart job before it looks at
the data, as every fit did before) and once as hora does now (no job: the data is reused, so
nothing would hide it), in alternating order. Reported: the median wall seconds of ``fit`` per
arm and their ratio. Needs Java and ``make install``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import hora.runners as hr
    import hora.spark as face
    from benchmarks.chaos_soak import _fit, _frame, spark_session
    from hora.runners.launchers.spark import SparkLauncher
    from hora.store import Store
    from _common.spark import StandaloneCluster

    times: dict[str, list[float]] = {"prestart job (before)": [], "no job (now)": []}
    with tempfile.TemporaryDirectory(prefix="hora-bench-prestart-") as tmp:
        work = Path(tmp)
        cluster = StandaloneCluster(work / "spark").start()
        try:
            spark = spark_session(cluster, "hora-bench-prestart")
            try:
                pdf = _frame(256)
                df = spark.createDataFrame(pdf.assign(features=[r.tolist() for r in pdf["features"]]))
                store = Store.create(str(work / "store"))
                launcher = hr.SparkLauncher(spark, task_cpus=2)
                _fit(face, launcher, df, store, "first", args.epochs, str(work / "first.log"), 0, 0.0)
                for i in range(args.pairs):
                    arms = list(times) if i % 2 == 0 else list(reversed(times))
                    for arm in arms:
                        SparkLauncher.prestart_takes_slots = arm == "no job (now)"
                        run = f"{'job' if 'before' in arm else 'none'}-{i}"
                        _, seconds = _fit(face, launcher, df, store, run, args.epochs, str(work / f"{run}.log"), 0, 0.0)
                        times[arm].append(seconds)
                        print(f"# pair {i} {arm}: {seconds:.2f} s", flush=True)
                        time.sleep(0.5)
            finally:
                SparkLauncher.prestart_takes_slots = True
                spark.stop()
        finally:
            cluster.stop()
    before, now = (statistics.median(v) for v in times.values())
    print(f"\n# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load {' / '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.pairs} pairs, {args.epochs} epoch(s)")
    print("| Spark fit, data reused | median s | all (s) |")
    print("|---|---|---|")
    for arm, values in times.items():
        print(f"| {arm} | {statistics.median(values):.2f} | {' / '.join(f'{v:.2f}' for v in values)} |")
    print(f"| **ratio** | **{before / now:.2f} x** | |")


if __name__ == "__main__":
    main()
