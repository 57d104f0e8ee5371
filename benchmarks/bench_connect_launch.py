"""Launch of ``hora.runners.run`` on a Spark Connect session against a classic session, same run.

Both sessions run ``local[2]`` on this machine: the classic one in this process's JVM, the
Connect one in a Spark Connect server started here (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, the same helper the tests use).
The same ``hora.runners.run(fn, num_proc=2, backend="spark", spark=...)`` call is timed on
each, alternating, after one warm-up run per session:

* launch: from the call until every rank is inside ``fn`` (each rank writes ``time.time()``
  on entry; the ranks and the driver share this machine's clock); hora's time includes
  ``hora.native.init()``;
* total: the call until it returns (``fn`` returns at once).

    python benchmarks/bench_connect_launch.py [--repeats 5]

Prints a markdown table with the medians and the Connect / classic ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _mark_entry(out_dir: str) -> None:
    import os as _os
    import time as _time

    with open(_os.path.join(out_dir, f"rank.{_os.environ['HORA_RANK']}"), "w") as fh:
        fh.write(repr(_time.time()))


def _one_run(spark, n: int) -> tuple[float, float]:
    import hora.runners as hr

    out_dir = tempfile.mkdtemp(prefix="hora-bench-connect-")
    start = time.time()
    hr.run(_mark_entry, args=(out_dir,), num_proc=n, backend="spark", spark=spark, verbose=0)
    total = time.time() - start
    stamps = []
    for r in range(n):
        with open(os.path.join(out_dir, f"rank.{r}")) as fh:
            stamps.append(float(fh.read()))
        os.unlink(os.path.join(out_dir, f"rank.{r}"))
    os.rmdir(out_dir)
    return max(stamps) - start, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = 2

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from _common.spark import ConnectServer

    classic = (
        SparkSession.builder.master(f"local[{n}]")
        .appName("hora-bench-connect-launch")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    classic.sparkContext.setLogLevel("ERROR")
    server = ConnectServer(tempfile.mkdtemp(prefix="hora-bench-connect-server-"), master=f"local[{n}]",
                           conf={"spark.eventLog.enabled": "false"})
    times: dict[str, list[tuple[float, float]]] = {"classic": [], "connect": []}
    try:
        server.start()
        connect = server.session()
        sessions = {"classic": classic, "connect": connect}
        for name, session in sessions.items():  # warm-up: Python workers, imports
            _one_run(session, n)
        for _ in range(args.repeats):
            for name, session in sessions.items():
                times[name].append(_one_run(session, n))
        connect.stop()
    finally:
        server.stop()
        classic.stop()

    load = os.getloadavg()
    print(f"\nhora.runners.run, {n} ranks on local[{n}], median of {args.repeats} (after a warm-up), "
          f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}:\n")
    print("| session | launch s (median) | launch runs | total s (median) | launch ratio vs classic | total ratio |")
    print("|---|---:|---|---:|---:|---:|")
    base_launch = statistics.median(t[0] for t in times["classic"])
    base_total = statistics.median(t[1] for t in times["classic"])
    for name, runs in times.items():
        launch = statistics.median(t[0] for t in runs)
        total = statistics.median(t[1] for t in runs)
        print(f"| {name} | {launch:.2f} | {', '.join(f'{t[0]:.2f}' for t in runs)} | {total:.2f} | "
              f"{launch / base_launch:.2f} | {total / base_total:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
