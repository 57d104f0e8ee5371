"""Allreduce throughput, 2 ranks over loopback: hora vs the raw library in the same run.

* 64 MiB float32: hora (Gloo) vs raw ``torch.distributed.all_reduce`` in place, with the
  calls Horovod users write (``hvd.allreduce(t)``: a new tensor, Sum and Average) beside
  the in-place one, interleaved; also with every result kept alive (no buffer comes back
  to the engine's output pool, so each call maps a fresh one), and what the memory
  allows (a warm copy, a copy into fresh pages, into fresh huge pages). With ``--mpi``
  also hora (MPI) vs raw mpi4py ``Allreduce``, both under one ``mpiexec``.
  The last lines are the goal rows of benchmarks/README.md (run once as is and once with
  ``HORA_SHM_ALLREDUCE=0``).
* 1000 tensors of 4 KiB reduced one by one (synchronous calls): reported only.
* latency of one small op (one float32): ``hvd.allreduce(t, name=...)`` (the response
  cache's path), ``hvd.allreduce(t)`` unnamed (a made-up name, negotiated by name every
  call: what Horovod code that logs a metric each step does) and ``hvd.barrier()``,
  against raw ``all_reduce`` and ``barrier``: reported only.
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
from _common import GOAL_HEADER, ROOT, goal_row, load_now, machine_note, run_local, table  # noqa: E402

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


def _memory_costs(numel: int, reps: int) -> dict[str, float]:
    """What the machine's memory allows for ``numel`` float32 (one rank, while the other
    waits): a warm copy, the first touch of a fresh torch buffer (its page faults), and
    the first touch of a fresh huge-page mapping of the engine's output pool."""
    import statistics as st

    import torch

    from hora.native.engine.fusion import OutputPool

    src = torch.ones(numel)
    dst = torch.empty(numel)
    dst.copy_(src)
    warm, fresh, fresh_huge = [], [], []
    for _ in range(max(3, reps // 4)):
        t = time.perf_counter()
        dst.copy_(src)
        warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        torch.empty(numel).copy_(src)
        fresh.append(time.perf_counter() - t)
        pool = OutputPool()
        t = time.perf_counter()
        pool.empty((numel,), torch.float32).copy_(src)
        fresh_huge.append(time.perf_counter() - t)
        pool.clear()
    return {"mem_copy_warm": st.median(warm), "mem_copy_fresh": st.median(fresh),
            "mem_copy_fresh_huge": st.median(fresh_huge)}


def gloo_worker(numel: int, reps: int, small_n: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import hora.native as hn
    from _common import raw_gloo_group
    from hora.native.engine import fusion

    store = raw_gloo_group()
    hn.init()
    big = torch.ones(numel)
    kept: list = []

    def kept_average() -> None:
        # the result stays alive until after the next call (as if the caller kept it), and
        # every call maps a fresh output buffer: from a pool of its own, empty each time.
        # (It used to empty the process's pool instead, which also unmapped the buffer the
        # Sum row's steady state reuses: that row, the next to allocate, paid a fresh
        # mapping's page faults every time, and read 0.15-0.3 x below the Average row.)
        shared, fusion.OUTPUTS = fusion.OUTPUTS, fusion.OutputPool()
        try:
            kept.append(hn.allreduce(big, op=hn.Average, name="big.kept"))
        finally:
            fusion.OUTPUTS = shared
        del kept[:-1]

    res = _interleaved({
        "raw": lambda: dist.all_reduce(big),
        "hora_inplace_sum": lambda: hn.allreduce_(big, op=hn.Sum, name="big"),
        "hora_sum": lambda: hn.allreduce(big, op=hn.Sum, name="big.sum"),
        "hora_average": lambda: hn.allreduce(big, op=hn.Average, name="big.avg"),
        "hora_average_kept": kept_average,
    }, reps, dist.barrier)
    kept.clear()
    if hn.rank() == 0:
        res.update(_memory_costs(numel, reps))
    dist.barrier()
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
    one = torch.ones(1)

    def ten(fn):  # ten calls back to back: a median over repetitions of the mean call
        def run() -> None:
            for _ in range(10):
                fn()
        return run

    lat = _interleaved({
        "raw": ten(lambda: dist.all_reduce(one)),
        "named": ten(lambda: hn.allreduce(one, op=hn.Sum, name="one.named")),
        "unnamed": ten(lambda: hn.allreduce(one, op=hn.Sum)),
        "raw_barrier": ten(dist.barrier),
        "barrier": ten(hn.barrier),
    }, max(5, reps), dist.barrier)
    res.update({f"one_{k}": v / 10 for k, v in lat.items() if not k.endswith("_best")})
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
        "hora_sum": lambda: hn.allreduce(big, op=hn.Sum, name="big.sum"),
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
    mib = numel * 4 // MIB
    rb, hb = res["raw_best"], res["hora_inplace_sum_best"]
    rows = [(f"{mib} MiB float32, {lib} (best of N)", raw_name, f"{gb / rb:.2f} GB/s",
             "hora allreduce_ (Sum, in place)", f"{gb / hb:.2f} GB/s", f"{rb / hb:.3f}")]
    for key, what in (("hora_inplace_sum", "hora allreduce_ (Sum, in place)"),
                      ("hora_sum", "hora allreduce (Sum, new tensor)"),
                      ("hora_average", "hora allreduce (Average, new tensor)"),
                      ("hora_average_kept", "hora allreduce (Average, new tensor, results kept: fresh buffers)")):
        if key in res:
            rows.append((f"{mib} MiB float32, {lib}", raw_name, f"{gb / raw:.2f} GB/s", what,
                         f"{gb / res[key]:.2f} GB/s", f"{raw / res[key]:.3f}"))
    rows.append((f"{small_n} x 4 KiB one by one, {lib}", raw_name, f"{res['small_raw'] * 1e3:.1f} ms",
                 "hora allreduce_ per tensor", f"{res['small_hora'] * 1e3:.1f} ms",
                 f"{res['small_raw'] / res['small_hora']:.3f}"))
    for key, base, what in (("one_named", "one_raw", "hora allreduce(t, name=) (cached)"),
                            ("one_unnamed", "one_raw", "hora allreduce(t) unnamed (negotiated by name)"),
                            ("one_barrier", "one_raw_barrier", "hora barrier()")):
        if key in res:
            raw_name_1 = "barrier" if "barrier" in base else raw_name
            rows.append((f"1 float32, one op, {lib} (latency)", raw_name_1, f"{res[base] * 1e6:.0f} us", what,
                         f"{res[key] * 1e6:.0f} us", f"{res[base] / res[key]:.3f}"))
    for work, what in ((0, "back to back"), (80, "~5 ms compute between ops")):
        if f"grouped{work}_raw" in res:
            raw_s, hora_s = res[f"grouped{work}_raw"], res[f"grouped{work}_hora"]
            rows.append((f"8 tensors 1-100 KB, one grouped op, {what}, {lib}", "hand-fused cat + all_reduce",
                         f"{raw_s * 1e3:.2f} ms", "hora grouped_allreduce_", f"{hora_s * 1e3:.2f} ms",
                         f"{raw_s / hora_s:.3f}"))
    return rows


def _memory_rows(res: dict[str, float], numel: int) -> list[tuple]:
    gb = numel * 4 / 1e9
    out = []
    for key, what in (("mem_copy_warm", "copy into a warm buffer"),
                      ("mem_copy_fresh", "copy into a fresh torch.empty buffer (page faults)"),
                      ("mem_copy_fresh_huge", "copy into a fresh output-pool mapping (huge pages)")):
        if key in res:
            out.append((f"{numel * 4 // MIB} MiB float32, one rank", what, f"{res[key] * 1e3:.1f} ms",
                        f"{gb / res[key]:.2f} GB/s"))
    return out


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
    load = load_now()
    res = run_local(gloo_worker, 2, args=(numel, a.reps, a.small))[0]
    rows = _rows(res, numel, a.small, "Gloo", "torch.distributed.all_reduce")
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
    mem = _memory_rows(res, numel)
    if mem:
        print()
        print(table(mem, ("memory", "what", "time", "bandwidth")))
    shm = os.environ.get("HORA_SHM_ALLREDUCE", "1") not in ("0", "false", "no", "off")
    transport = "" if shm else ", HORA_SHM_ALLREDUCE=0"
    mib = a.mib
    print("\ngoal rows (benchmarks/README.md):\n")
    print(GOAL_HEADER)
    for key, what in (("hora_sum", "Sum"), ("hora_average", "Average")):
        ratio = res["raw"] / res[key]
        print(goal_row(f"`hvd.allreduce(t)` {mib} MiB float32, out of place, {what}{transport}",
                       "raw `torch.distributed.all_reduce` in place over Gloo", f"{ratio:.2f} x", ">= 1.5 x",
                       ratio >= 1.5, load))
    ratio = res["raw"] / res["hora_inplace_sum"]
    print(goal_row(f"`hvd.allreduce_(t)` {mib} MiB float32, in place, Sum{transport} (reference)",
                   "raw `torch.distributed.all_reduce` in place over Gloo", f"{ratio:.2f} x", "-", None, load))


if __name__ == "__main__":
    main()
