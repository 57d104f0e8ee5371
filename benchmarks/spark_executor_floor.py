"""What Spark alone needs to replace a killed executor: the floor under hora's time lost per executor
fault in ``chaos_soak.py --scenarios spark``.

Run: ``.venv/bin/python benchmarks/spark_executor_floor.py [--kills 3] [--rdd]``. On the soak's standalone cluster
(a master and two 2-core workers on 127.0.0.1 and 127.0.0.2, ``spark.executor.memory=768m``) and with
its stage's shape (two tasks of ``task_cpus=2``, a barrier ``spark.range(2).mapInArrow``: each executor
is one slot, so the stage needs the replacement), but a task body that does nothing (no hora, no
torch): per kill, SIGKILL the executor JVM on 127.0.0.2 while the application is idle, wait for
the replacement executor to register (as hora's relaunch waits for the slots: a barrier stage
submitted without them waits ``spark.scheduler.barrier.maxConcurrentTasksCheck.interval``, 15 s),
submit the stage (again if it fails), and time both from the kill; the stage's first task there
starts a Python worker on a fresh JVM. The same stage on the two running
executors is timed first (the reference). ``--rdd``: the same no-op barrier stage on the RDD API
(``sc.parallelize(range(2), 2).withResources(profile).barrier().mapPartitions``: no SQL plan to
compile, no Arrow), which a classic session could run and Spark Connect cannot. Prints a markdown table. Needs Java and ``make install``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _noop(batches):
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"ok": pa.array([True])})


def _count(items):
    return [sum(1 for _ in items)]


def _executor_pid(host: str) -> int:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and host in cmd:
            return proc.pid
    raise RuntimeError(f"no executor JVM on {host}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rdd", action="store_true", help="the stage on the RDD API instead of the DataFrame API")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests
    from benchmarks.chaos_soak import spark_session
    from _common.spark import StandaloneCluster

    with tempfile.TemporaryDirectory(prefix="hora-spark-floor-") as tmp:
        cluster = StandaloneCluster(Path(tmp) / "spark").start()
        try:
            spark = spark_session(cluster, "hora-spark-floor")
            profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(2)).build

            def stage() -> float:
                start = time.monotonic()
                if args.rdd:
                    rows = spark.sparkContext.parallelize(range(2), 2).withResources(profile).barrier().mapPartitions(
                        _count).collect()
                else:
                    rows = spark.range(0, 2, 1, numPartitions=2).mapInArrow(_noop, "ok boolean", barrier=True,
                                                                            profile=profile).collect()
                assert len(rows) == 2
                return time.monotonic() - start

            def executors() -> set[tuple[str, int]]:
                    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
                    return {(info.host(), info.port()) for info in infos}

            registered: list[float] = []
            try:
                for _ in range(2):  # both executors up, their Python workers started
                    stage()
                warm = [stage() for _ in range(3)]
                replaced = []
                for i in range(args.kills):
                    pid = _executor_pid("127.0.0.2")
                    before = executors()
                    killed = time.monotonic()
                    os.kill(pid, signal.SIGKILL)
                    while not (executors() - before):  # as hora's relaunch: submit once the slots are back
                        time.sleep(0.05)
                    registered.append(time.monotonic() - killed)
                    for attempt in range(5):  # a stage given the dying executor's slot fails: submit it again
                        try:
                            stage()
                            break
                        except Exception as exc:
                            print(f"# kill {i}: stage attempt {attempt} failed: {str(exc).splitlines()[0][:120]}")
                    replaced.append(time.monotonic() - killed)
                    print(f"# kill {i}: executor pid {pid}: its replacement registered {registered[-1]:.2f} s and the stage "
                          f"done {replaced[-1]:.2f} s after the kill",
                          flush=True)
                    for _ in range(2):
                        stage()  # the replacement's Python worker is up before the next kill
                    time.sleep(1.0)
            finally:
                spark.stop()
        finally:
            cluster.stop()
    print(f"\n# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load {' / '.join(f'{v:.1f}' for v in os.getloadavg())}")
    api = "RDD" if args.rdd else "DataFrame"
    print(f"| a barrier stage of 2 no-op Python tasks (task_cpus=2), {api} API | median s | all (s) |")
    print("|---|---|---|")
    print(f"| on the running executors | {statistics.median(warm):.2f} | {' / '.join(f'{v:.2f}' for v in warm)} |")
    print(f"| the replacement executor registered, from the SIGKILL | {statistics.median(registered):.2f} | "
          f"{' / '.join(f'{v:.2f}' for v in registered)} |")
    print(f"| submitted once it registered, done (from the SIGKILL) | {statistics.median(replaced):.2f} | "
          f"{' / '.join(f'{v:.2f}' for v in replaced)} |")


if __name__ == "__main__":
    main()
