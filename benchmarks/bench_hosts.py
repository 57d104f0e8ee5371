"""Hierarchical allreduce: ranks on several hosts, several ranks per host.

Four ranks on two "hosts" (two loopback addresses, 127.0.0.1 and 127.0.0.2, two ranks
each, as Spark executors with two slots would be): hora's allreduce (through shared
memory on each host, through Gloo between one rank per host) against Gloo's own over all
four ranks, on the same Gloo group of the same job, interleaved. Reports the median
wall time per call and the CPU time per call and rank (all threads of the process).
On one machine "between hosts" is loopback too, so read the ratio as what the
hierarchy saves in bytes each rank pushes through TCP, not as a network result.

    python benchmarks/bench_hosts.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_note, run_local, table  # noqa: E402

MIB = 1024 * 1024
HOSTS = ("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2")


def worker(sizes_mib: list[int], reps: int) -> dict:
    import os

    import torch

    # two ranks a "host": the address each rank advertises places it (hora's topology and Gloo's)
    os.environ["HORA_HOSTNAME"] = HOSTS[int(os.environ["HORA_RANK"])]

    from hora.native.backends import create_backend
    from hora.native.backends.base import ReduceOp

    be, _, closers = create_backend()
    out: dict = {"kind": type(be.world.shm).__name__}
    try:
        ways = {"hora": lambda t: be.allreduce(t, ReduceOp.Sum, be.world),
                "gloo": lambda t: be._gloo_allreduce(t, ReduceOp.Sum, be.world)}
        for mib in sizes_mib:
            t = torch.randn(mib * MIB // 4)
            wall: dict[str, list[float]] = {k: [] for k in ways}
            cpu: dict[str, list[float]] = {k: [] for k in ways}
            for name, fn in ways.items():  # warm-up
                fn(t)
            for _ in range(reps):
                for name, fn in ways.items():
                    be.barrier(be.world)
                    w, c = time.perf_counter(), time.process_time()
                    fn(t)
                    wall[name].append(time.perf_counter() - w)
                    cpu[name].append(time.process_time() - c)
            out[mib] = {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in ways}
    finally:
        be.shutdown()
        for c in closers:
            c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mib", type=int, action="append", default=[])
    a = ap.parse_args()
    sizes = a.mib or [4, 64]
    note = machine_note()
    outs = run_local(worker, len(HOSTS), args=(sizes, a.reps), timeout=1200)
    assert all(o["kind"] == "HierarchicalReducer" for o in outs), [o["kind"] for o in outs]
    rows = []
    for mib in sizes:
        gw = statistics.median(o[mib]["gloo"][0] for o in outs)
        hw = statistics.median(o[mib]["hora"][0] for o in outs)
        gc = statistics.mean(o[mib]["gloo"][1] for o in outs)
        hc = statistics.mean(o[mib]["hora"][1] for o in outs)
        rows.append((f"{mib} MiB float32", f"{gw * 1e3:.1f} ms", f"{gc * 1e3:.1f} ms", f"{hw * 1e3:.1f} ms",
                     f"{hc * 1e3:.1f} ms", f"{gw / hw:.2f}", f"{gc / hc:.2f}"))
    print(f"## bench_hosts: 4 ranks on 2 loopback hosts ({note.split(';')[0]}), median of {a.reps}\n")
    print(table(rows, ("case", "Gloo, 4 ranks", "Gloo CPU/rank", "hora hierarchical", "hora CPU/rank",
                       "speed-up (wall)", "CPU saved (x)")))


if __name__ == "__main__":
    main()
