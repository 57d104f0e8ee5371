"""Allreduce throughput, 2 ranks over loopback: hora vs the raw library in the same run.

* 64 MiB float32: hora (Gloo) vs raw ``torch.distributed.all_reduce``; with ``--mpi``
  also hora (MPI) vs raw mpi4py ``Allreduce``, both under one ``mpiexec``.
* 1000 tensors of 4 KiB reduced one by one (synchronous calls): reported only.
* latency of one synchronous ``grouped_allreduce_`` of 8 tensors of 1-100 KB (a small
  model's gradients), back to back and with ~5 ms of compute (matmuls) between ops,
  against the hand-fused ``cat`` + ``all_reduce`` + copy back of the same tensors:
  reported only (the engine adds a negotiation round and a wake-up per op).

Bandwidth is bytes of the tensor / median seconds per call ("algorithm bandwidth").

    python benchmarks/bench_allreduce.py [--mpi] [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _native_common import ROOT, machine_note, run_local, table  # noqa: E402

MIB = 1024 * 1024
GROUP_FLOATS = [256, 1024, 4096, 8192, 16384, 25000, 512, 2048]  # 1 KB .. 100 KB each


def _grouped_latency(reps: int, barrier) -> dict[str, float]:
    """Median seconds of one grouped op (8 small tensors), raw hand-fused vs hora, with and
    without compute between ops (interleaved repetitions of 10 ops each)."""
    import torch
    import torch.distributed as dist

    import hora.native as hn

    ts = [torch.ones(n) for n in GROUP_FLOATS]
    flat = torch.empty(sum(GROUP_FLOATS))
    a = torch.randn(128, 128)

    def raw() -> None:
        torch.cat(ts, out=flat)
        dist.all_reduce(flat)
        torch._foreach_copy_(ts, list(flat.split(GROUP_FLOATS)))

    def hora() -> None:
        hn.grouped_allreduce_(ts, op=hn.Sum, name="grouped.small")

    out: dict[str, list[float]] = {}
    for _ in range(2):  # warm-up
        raw()
        hora()
    for _ in range(reps):
        for work in (0, 80):
            for key, fn in (("raw", raw), ("hora", hora)):
                barrier()
                for _ in range(10):
                    for _ in range(work):
                        torch.mm(a, a)
                    t = time.perf_counter()
                    fn()
                    out.setdefault(f"grouped{work}_{key}", []).append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


def _interleaved(fns: dict, reps: int, barrier) -> dict[str, float]:
    """Median seconds per call of each fn, alternating between them every repetition."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():  # warm-up
        f()
    for _ in range(reps):
        for k, f in fns.items():
            barrier()
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update({f"{k}_best": min(v) for k, v in times.items()})
    return out


def gloo_worker(numel: int, reps: int, small_n: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import hora.native as hn
    from _native_common import raw_gloo_group

    store = raw_gloo_group()
    hn.init()
    big = torch.ones(numel)
    res = _interleaved({
        "raw": lambda: dist.all_reduce(big),
        "hora_inplace_sum": lambda: hn.allreduce_(big, op=hn.Sum, name="big"),
        "hora_average": lambda: hn.allreduce(big, op=hn.Average, name="big.avg"),
    }, reps, dist.barrier)
    small = [torch.ones(1024) for _ in range(small_n)]

    def raw_small() -> None:
        for t in small:
            dist.all_reduce(t)

    def hora_small() -> None:
        for i, t in enumerate(small):
            hn.allreduce_(t, op=hn.Sum, name=f"small.{i}")

    res.update({f"small_{k}": v for k, v in _interleaved({"raw": raw_small, "hora": hora_small}, 2,
                                                          dist.barrier).items()})
    res.update(_grouped_latency(max(2, reps // 4), dist.barrier))
    hn.shutdown()
    dist.destroy_process_group()
    del store
    return res


def mpi_worker(numel: int, reps: int, small_n: int) -> None:
    """Runs under mpiexec: raw mpi4py vs hora on the MPI backend; rank 0 prints JSON."""
    import torch
    from mpi4py import MPI

    import hora.native as hn

    comm = MPI.COMM_WORLD
    hn.init()
    assert hn.backend_name() == "mpi", hn.backend_name()
    big = torch.ones(numel)
    arr = big.numpy()
    res = _interleaved({
        "raw": lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM),
        "hora_inplace_sum": lambda: hn.allreduce_(big, op=hn.Sum, name="big"),
        "hora_average": lambda: hn.allreduce(big, op=hn.Average, name="big.avg"),
    }, reps, comm.Barrier)
    small = [torch.ones(1024) for _ in range(small_n)]

    def raw_small() -> None:
        for t in small:
            comm.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)

    def hora_small() -> None:
        for i, t in enumerate(small):
            hn.allreduce_(t, op=hn.Sum, name=f"small.{i}")

    res.update({f"small_{k}": v for k, v in _interleaved({"raw": raw_small, "hora": hora_small}, 2,
                                                          comm.Barrier).items()})
    hn.shutdown()
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(res), flush=True)


def _rows(res: dict[str, float], numel: int, small_n: int, lib: str, raw_name: str) -> list[tuple]:
    gb = numel * 4 / 1e9
    raw = res["raw"]
    rb, hb = res["raw_best"], res["hora_inplace_sum_best"]
    rows = [
        (f"{numel * 4 // MIB} MiB float32, {lib} (best of N)", raw_name, f"{gb / rb:.2f} GB/s",
         "hora allreduce_ (Sum, in place)", f"{gb / hb:.2f} GB/s", f"{rb / hb:.3f}"),
        (f"{numel * 4 // MIB} MiB float32, {lib}", raw_name, f"{gb / raw:.2f} GB/s", "hora allreduce_ (Sum, in place)",
         f"{gb / res['hora_inplace_sum']:.2f} GB/s", f"{raw / res['hora_inplace_sum']:.3f}"),
        (f"{numel * 4 // MIB} MiB float32, {lib}", raw_name, f"{gb / raw:.2f} GB/s",
         "hora allreduce (Average, new tensor)", f"{gb / res['hora_average']:.2f} GB/s",
         f"{raw / res['hora_average']:.3f}"),
        (f"{small_n} x 4 KiB one by one, {lib}", raw_name, f"{res['small_raw'] * 1e3:.1f} ms",
         "hora allreduce_ per tensor", f"{res['small_hora'] * 1e3:.1f} ms", f"{res['small_raw'] / res['small_hora']:.3f}"),
    ]
    for work, what in ((0, "back to back"), (80, "~5 ms compute between ops")):
        if f"grouped{work}_raw" in res:
            raw_s, hora_s = res[f"grouped{work}_raw"], res[f"grouped{work}_hora"]
            rows.append((f"8 tensors 1-100 KB, one grouped op, {what}, {lib}", "hand-fused cat + all_reduce",
                         f"{raw_s * 1e3:.2f} ms", "hora grouped_allreduce_", f"{hora_s * 1e3:.2f} ms",
                         f"{raw_s / hora_s:.3f}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mpi", action="store_true", help="also run the MPI comparison under mpiexec")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    numel = a.mib * MIB // 4
    if a.mpi_worker:
        mpi_worker(numel, a.reps, a.small)
        return
    note = machine_note()
    rows = _rows(run_local(gloo_worker, 2, args=(numel, a.reps, a.small))[0], numel, a.small, "Gloo",
                 "torch.distributed.all_reduce")
    if a.mpi:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--mpi-worker", "--reps",
                               str(a.reps), "--mib", str(a.mib), "--small", str(a.small)],
                              env=env, capture_output=True, text=True, timeout=900)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            raise SystemExit("the MPI run failed")
        rows += _rows(json.loads(line[7:]), numel, a.small, "MPI", "mpi4py Allreduce")
    print(f"## bench_allreduce: 2 ranks, loopback ({note}), median of {a.reps} unless marked best\n")
    print(table(rows, ("case", "baseline", "baseline speed", "hora", "hora speed", "hora / baseline")))
    big = [r for r in rows if "MiB" in r[0] and "in place" in r[3] and "best" not in r[0]]
    ok = all(float(r[5]) >= 0.95 for r in big)
    print(f"\ngoal 64 MiB in place >= 0.95 x baseline: {'met' if ok else 'NOT met'} "
          f"({', '.join(r[5] for r in big)})")


if __name__ == "__main__":
    main()
