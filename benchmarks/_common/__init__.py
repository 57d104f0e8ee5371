"""The benchmarks' shared harness: start N local ranks, time things, print tables.

Run as scripts (``python benchmarks/<name>.py``), the benchmarks import this package as ``_common``;
the tests import the process harnesses they share with the benchmarks as ``benchmarks._common``:
:mod:`.spark` (a Spark Connect server, a standalone cluster), :mod:`.sshd` (a throwaway OpenSSH
server), :mod:`.s3_faults` (an S3 proxy that fails a share of the requests) and :mod:`.processes`
(finding a run's rank processes). Nothing here imports ``tests``.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run_local(fn: Callable[..., Any], size: int, args: tuple = (), env: dict[str, str] | None = None,
              timeout: float = 600.0) -> list[Any]:
    """Run ``fn(*args)`` on ``size`` local ranks of a hora job (loopback, one thread a rank); ``fn`` calls
    ``hora.native.init()`` itself. Returns the ranks' values in rank order."""
    from hora.runners import run

    base = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    base.update(env or {})
    return run(fn, args=args, num_proc=size, backend="local", env=base, timeout=timeout, init_native=False)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def raw_gloo_group(port_key: str = "bench_raw_port") -> Any:
    """A plain torch.distributed gloo default group over loopback, for the baselines.

    Rank 0 picks a free port and shares it through the hora rendezvous store.
    """
    import torch.distributed as dist

    from hora.native.rendezvous import KVClient, WorkerEnv

    env = WorkerEnv.from_environ()
    kv = KVClient(env.rendezvous_addr, env.secret)
    if env.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, env.size, True, datetime.timedelta(seconds=60), wait_for_workers=False)
        kv.set(port_key, str(store.port).encode())
    else:
        port = int(kv.get(port_key, timeout=60))
        store = dist.TCPStore("127.0.0.1", port, env.size, False, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=env.rank, world_size=env.size,
                            timeout=datetime.timedelta(seconds=120))
    return store


def timeit(fn: Callable[[], Any], repeat: int, warmup: int = 1, barrier: Callable[[], Any] | None = None) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs (after ``warmup``)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if barrier is not None:
            barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def table(rows: list[tuple], header: tuple) -> str:
    cols = list(zip(*([header] + [tuple(str(c) for c in r) for r in rows])))
    widths = [max(len(c) for c in col) for col in cols]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def machine_note() -> str:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    shm = os.environ.get("HORA_SHM_ALLREDUCE", "1").strip().lower() not in ("0", "false", "no", "off")
    transport = ("hora's allreduce through shared memory, baselines through Gloo" if shm
                 else "hora's allreduce through Gloo too (HORA_SHM_ALLREDUCE=0)")
    return f"{os.cpu_count()} CPUs, load average {load:.2f} at start; {transport}"


def load_now() -> str:
    """The 1/5/15-minute load averages, as the goal rows show them."""
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def goal_row(measure: str, baseline: str, value: str, goal: str, met: bool | None, load: str) -> str:
    """One row of benchmarks/README.md's goal table: | measure | baseline | hora | goal | met | load |
    (``met`` None: a reference row without a goal)."""
    mark = "-" if met is None else ("yes" if met else "NO")
    return f"| {measure} | {baseline} | {value} | {goal} | {mark} | {load} |"


GOAL_HEADER = ("| measure (2 ranks, loopback, same run) | baseline | hora | goal | met | load (1/5/15 min) |\n"
               "|---|---|---:|---|---|---|")
