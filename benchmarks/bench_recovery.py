"""Time from a killed rank to training going on again, with ``hora.runners.run(max_failures=1)``.

Two ranks allreduce in a loop; at step 5 of the first attempt rank 1 is SIGKILLed (its
own process, or on Dask also the whole worker process, which the nanny restarts). The
monitor sees the lost rank, stops the survivor, and relaunches; the time is measured
from the kill (rank 1 writes ``time.time()`` just before it) to the moment every rank of
attempt 2 has finished its first allreduce. It splits into

* *detect + stop*: the kill until the driver logs the relaunch (root cause chosen, the
  survivor stopped, the old driver service closed);
* *relaunch*: from there until every new rank has done one allreduce (start, rendezvous,
  ``hora.native.init()``, the first step).

The baseline, in the same run: a cold start of the same function (``run()`` called until
every rank finished its first allreduce). All ranks run on this machine, so the clocks agree.

    python benchmarks/bench_recovery.py [--repeats 3] [--only local,spark,dask,dask-worker]

Prints a markdown table of medians (after one warm-up run per launcher).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

KILL_STEP = 5
STEPS = 12


def _train(out_dir: str, fault: str) -> int:
    """The rank body: ``STEPS`` allreduces; stamps the first step of each attempt and the kill."""
    import numpy as np

    import hora.native as hn

    attempt = os.environ["HORA_ATTEMPT"]
    for step in range(STEPS):
        hn.allreduce(np.ones(1024), op=hn.Sum, name=f"bench.recovery.{step}")
        if step == 0:
            with open(os.path.join(out_dir, f"step0.{attempt}.{hn.rank()}"), "w") as fh:
                fh.write(repr(time.time()))
        if fault != "none" and attempt == "1" and hn.rank() == 1 and step == KILL_STEP:
            with open(os.path.join(out_dir, "kill"), "w") as fh:
                fh.write(repr(time.time()))
            victim = int(os.environ["HORA_SUPERVISOR_PID"]) if fault == "worker" else os.getpid()
            os.kill(victim, signal.SIGKILL)
            time.sleep(60)
    return hn.rank()


def _stamp(out_dir: str, name: str) -> float:
    with open(os.path.join(out_dir, name)) as fh:
        return float(fh.read())


class _RelaunchClock(logging.Handler):
    """Remembers when the driver logged the relaunch."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "relaunching" in record.getMessage():
            self.at = record.created


def measure(run, fault: str, clock: _RelaunchClock) -> tuple[float, float, float]:
    """``(total, detect+stop, relaunch)`` seconds of one run with a kill (``fault`` "rank"/"worker"),
    or ``(cold start, 0, 0)`` for ``fault="none"``."""
    out_dir = tempfile.mkdtemp(prefix="hora-bench-recovery-")
    try:
        clock.at = None
        start = time.time()
        assert run(out_dir, fault) == [0, 1]
        if fault == "none":
            return max(_stamp(out_dir, f"step0.1.{r}") for r in (0, 1)) - start, 0.0, 0.0
        kill = _stamp(out_dir, "kill")
        resumed = max(_stamp(out_dir, f"step0.2.{r}") for r in (0, 1))
        assert clock.at is not None, "no relaunch was logged"
        return resumed - kill, clock.at - kill, resumed - clock.at
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="local,spark,dask,dask-worker")
    args = parser.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import hora.runners as hr

    clock = _RelaunchClock()
    logging.getLogger("hora.runners.driver.recovery").addHandler(clock)
    logging.getLogger("hora.runners.driver.recovery").setLevel(logging.WARNING)
    closers = []
    launchers = {}
    try:
        if "local" in wanted:
            launchers["local"] = ("rank", {"backend": "local"})
        if "spark" in wanted:
            from pyspark.sql import SparkSession

            spark = (SparkSession.builder.master("local[2]").appName("hora-bench-recovery")
                     .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                     .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
            spark.sparkContext.setLogLevel("OFF")
            closers.append(spark.stop)
            launchers["spark"] = ("rank", {"backend": "spark", "spark": spark})
        if "dask" in wanted or "dask-worker" in wanted:
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=":0", silence_logs=logging.ERROR)
            client = Client(cluster)
            closers += [cluster.close, client.close]
            if "dask" in wanted:
                launchers["dask"] = ("rank", {"backend": "dask", "client": client})
            if "dask-worker" in wanted:
                launchers["dask-worker"] = ("worker", {"backend": "dask", "client": client})
        rows = []
        for name, (fault, kw) in launchers.items():
            def run(out_dir: str, fault_: str, kw=kw):
                if kw.get("client") is not None:
                    kw["client"].wait_for_workers(2, timeout=120)
                return hr.run(_train, args=(out_dir, fault_), num_proc=2, verbose=0, max_failures=1,
                              start_timeout=120, **kw)

            measure(run, "none", clock)  # warm-up
            cold = [measure(run, "none", clock)[0] for _ in range(args.repeats)]
            faults = [measure(run, fault, clock) for _ in range(args.repeats)]
            total = statistics.median(f[0] for f in faults)
            rows.append((name, fault, statistics.median(cold), total, statistics.median(f[1] for f in faults),
                         statistics.median(f[2] for f in faults)))
            print(f"{name}: cold {cold}, kill->resumed {[round(f[0], 2) for f in faults]}", file=sys.stderr)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average (1/5/15 min) at the end: {load}; median of {args.repeats} after a warm-up\n")
        print("| launcher | killed | cold start s | kill -> training again s | detect + stop s | relaunch s "
              "| ratio vs cold start |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for name, fault, cold_s, total, detect, relaunch in rows:
            what = "rank process" if fault == "rank" else "Dask worker process"
            print(f"| {name} | {what} | {cold_s:.2f} | {total:.2f} | {detect:.2f} | {relaunch:.2f} | "
                  f"{total / cold_s:.2f} |")
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
