"""Time of one ``hora.runners.run`` of 2 ranks on Ray against the same run on local processes.

Three variants of the call users write, each returning once both ranks ran a trivial
function (``hora.native`` initialised and shut down in each rank, an allreduce of one
number):

* **local**: ``hora.runners.run(fn, num_proc=2, backend="local")`` (2 processes);
* **ray**: ``hora.runners.run(fn, num_proc=2, backend="ray")`` (a placement group and
  2 fresh actors per run, removed at the end);
* **RayExecutor.run**: ``executor.run(fn)`` on 2 workers started once (the actors stay).

The Ray cluster is a local ``ray.init(num_cpus=4)`` (logical CPUs: the executor holds 2 while the per-run actors take 2 more) started once before timing (its
start-up is printed separately). The variants alternate after one warm-up round; the
table has the median of ``--repeats`` and the ratio against local.

    python benchmarks/bench_ray_launch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time


def _fn() -> float:
    import numpy as np

    import hora.native as hn

    return float(hn.allreduce(np.array([1.0]), op=hn.Sum, name="bench")[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    import hora.runners
    from hora.ray import RayExecutor

    t0 = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING, configure_logging=False)
    ray_start = time.perf_counter() - t0
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=2)
    t0 = time.perf_counter()
    executor.start()
    executor_start = time.perf_counter() - t0
    variants = {
        "local processes": lambda: hora.runners.run(_fn, num_proc=2, backend="local", verbose=0),
        "ray actors (new per run)": lambda: hora.runners.run(_fn, num_proc=2, backend="ray", verbose=0),
        "RayExecutor.run (actors kept)": lambda: executor.run(_fn),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for i in range(args.repeats + 1):
            for name, call in variants.items():
                t0 = time.perf_counter()
                assert call() == [2.0, 2.0]
                if i > 0:  # the first round warms imports and the page cache
                    times[name].append(time.perf_counter() - t0)
    finally:
        executor.shutdown()
        ray.shutdown()
    load = os.getloadavg()
    base = statistics.median(times["local processes"])
    print(f"\nOne run of 2 ranks, median of {args.repeats} (after a warm-up), load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores; ray.init() took "
          f"{ray_start:.1f} s, RayExecutor.start() {executor_start:.1f} s (not in the table):\n")
    print("| launch | median s | runs s | ratio vs local |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {', '.join(f'{t:.2f}' for t in ts)} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
