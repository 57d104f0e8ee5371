"""Training throughput: hora DistributedOptimizer vs torch DistributedDataParallel (gloo)
vs one process, measured in the same run.

    python benchmarks/bench_ddp.py [--steps 120] [--rounds 3] [--np 2]

The model is a CPU MLP of 16 hidden ``Linear(256, 256)`` layers (+ReLU) and a 10-way
head, batch 64 per rank, SGD, one torch thread per rank. Throughput is samples/s summed
over ranks: ``np * batch * steps / wall time`` of the measured steps, after warm-up steps,
timed between two barriers on rank 0. Each configuration runs ``--rounds`` times,
interleaved so that machine noise hits all of them alike; the table shows the median and
ratios against DDP (of the medians, and the median of each round's ratio to the DDP run
of the same round) and against one process. The last column is the CPU time per step
of one rank's process, all its threads together (compute, hora's engine thread, Gloo's
threads): on a machine shared with other work it shows the cost that wall time hides.

The last lines are the goal rows of benchmarks/README.md (hora, and hora-gloo: hora's
allreduce through Gloo's TCP loopback, as DDP's, instead of shared memory).

The default configurations are single (one process), local (both ranks training at once
with the plain optimizer, nothing reduced: the floor of any data-parallel run on this
machine, which two ranks sharing two cores and memory make slower than twice one
process), lockstep (the same, the ranks meeting at a barrier before every step, no data: the floor of any synchronous data-parallel run, each step as slow as
the slower rank's), ddp, hora and hora-gloo; the table gives each against DDP and against the floor
(paired per round), and the last line says how far above DDP the floor itself is.

``--only NAME`` (repeatable) picks configurations; there are variants of each side, so a difference can be traced to
its cause: hora-nospec (no predicted rounds), hora-first-1mb (DDP's small first bucket),
hora-by-name (gradients matched by name, Horovod style), ddp-one-bucket and ddp-view
(DDP's gradient_as_bucket_view=True).

The second table is the step of a small model, the one every tabular ``fit`` runs
(``bench_estimator.make_mlp``: MLP 32-64-64-1, 6.5K parameters, one 26 KB gradient
bucket; batch 1024 rows gathered from memory, MSE, SGD), where the engine's cost per
step, not the bytes, decides: *local* is both ranks training at once with the plain
optimizer (no reduction: the floor), *hora* the DistributedOptimizer, *ddp* torch DDP
over Gloo. It reports ms per step (rank 0, between barriers) and CPU ms per step (all
threads of a rank's process, mean over ranks), each against local and DDP of the same
round; ``--small-steps`` sets its length, ``--model big|small`` runs one table only.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import time
import traceback
from typing import Any

WIDTH, DEPTH, CLASSES, BATCH = 256, 16, 10, 64


def make_model():
    import torch

    layers: list[Any] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(WIDTH, CLASSES))
    torch.manual_seed(0)
    return torch.nn.Sequential(*layers)


def _batches(rank: int, n: int = 8):
    import torch

    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(n)]


_cpu_ms_per_step: list[float] = []  # of the last measured _loop in this process


def _loop(model, opt, data, steps: int, barrier) -> float:
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    barrier()
    t0 = time.perf_counter()
    c0 = time.process_time()  # every thread of this process: compute, engine, gloo
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    c1 = time.process_time()
    barrier()
    _cpu_ms_per_step[:] = [(c1 - c0) / steps * 1e3]
    return time.perf_counter() - t0


def _small_data(rank: int, rows: int = 200_000):
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, 32, generator=g), torch.randn(rows, 1, generator=g)


def _small_loop(model, opt, data, steps: int, barrier, metric=None) -> tuple[float, float]:
    """``steps`` steps of batch 1024 gathered from ``data`` in a random order; returns
    (wall ms per step, CPU ms per step of this process)."""
    import torch

    x, y = data
    loss_fn = torch.nn.MSELoss()
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    per_pass = x.shape[0] // 1024
    barrier()
    t0 = time.perf_counter()
    c0 = time.process_time()
    for i in range(steps):
        idx = order[(i % per_pass) * 1024:(i % per_pass + 1) * 1024]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        # what a fit's loss bookkeeping does; ``metric``: averaged over the ranks first, the
        # way Horovod code logs it (``hvd.allreduce(loss)``, unnamed)
        float(loss.detach()) if metric is None else float(metric(loss.detach()))
    c1 = time.process_time()
    barrier()
    return (time.perf_counter() - t0) / steps * 1e3, (c1 - c0) / steps * 1e3


def _small_worker(rank: int, size: int, port: int, steps: int, warmup: int) -> tuple[float, float]:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_estimator import make_mlp

    mode = os.environ["BENCH_SMALL_MODE"]
    torch.set_num_threads(1)
    data = _small_data(rank)
    model = make_mlp(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "ddp":
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, size, rank == 0, wait_for_workers=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
        try:
            model = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            _small_loop(model, opt, data, warmup, dist.barrier)
            wall, cpu_ms = _small_loop(model, opt, data, steps, dist.barrier)
        finally:
            dist.destroy_process_group()
            _leave_together(store, rank, size)
        return wall, cpu_ms
    import hora.torch as hvd

    hvd.init()
    try:
        if mode in ("hora", "hora-metric"):
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        # (local: the plain optimizer; hora only lines the ranks up, so both train at once)
        metric = hvd.allreduce if mode == "hora-metric" else None
        _small_loop(model, opt, data, warmup, hvd.barrier, metric)
        wall, cpu_ms = _small_loop(model, opt, data, steps, hvd.barrier, metric)
    finally:
        hvd.shutdown()
    return wall, cpu_ms


SMALL = {"local": "both ranks, plain optimizer (no reduction)", "hora": "hora DistributedOptimizer",
         "hora-metric": "hora DistributedOptimizer, plus hvd.allreduce(loss) unnamed every step",
         "ddp": "torch DDP gloo"}


def run_small(args: argparse.Namespace) -> None:
    """The small model's table (see the module docstring) and its goal rows."""
    load = os.getloadavg()
    wall: dict[str, list[float]] = {c: [] for c in SMALL}
    cpu: dict[str, list[float]] = {c: [] for c in SMALL}
    for r in range(args.rounds):
        for c in SMALL:
            # (rank 0's wall ms per step, the mean over ranks of CPU ms per step)
            w, cpu_ms = run_job(_small_worker, args.np, args.small_steps, args.warmup * 5,
                                extra_env={"BENCH_SMALL_MODE": c})
            wall[c].append(w)
            cpu[c].append(cpu_ms)
            print(f"round {r + 1}/{args.rounds} small {c}: {w:.3f} ms/step, {cpu_ms:.3f} CPU ms/step/rank",
                  file=sys.stderr, flush=True)
    med = lambda v: statistics.median(v)  # noqa: E731
    paired = lambda a, b: statistics.median(x / y for x, y in zip(a, b))  # noqa: E731
    print(f"\nsmall model: MLP 32-64-64-1, batch 1024/rank from memory, SGD, 1 thread/rank, {args.np} ranks, "
          f"{args.small_steps} steps x {args.rounds} rounds (median; ratios paired per round)\n")
    print("| configuration | ms/step | runs | CPU ms/step/rank | wall vs local | CPU vs local | wall vs DDP |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for c, label in SMALL.items():
        runs_s = ", ".join(f"{v:.2f}" for v in wall[c])
        print(f"| {label} | {med(wall[c]):.3f} | {runs_s} | {med(cpu[c]):.3f} | {paired(wall[c], wall['local']):.2f}x "
              f"| {paired(cpu[c], cpu['local']):.2f}x | {paired(wall[c], wall['ddp']):.2f}x |")
    loads = "/".join(f"{x:.1f}" for x in load)
    d_wall = statistics.median(a - b for a, b in zip(wall["hora"], wall["local"]))
    d_cpu = statistics.median(a - b for a, b in zip(cpu["hora"], cpu["local"]))
    print("\ngoal rows (benchmarks/README.md):\n")
    print("| measure (2 ranks, loopback, same run) | baseline | hora | goal | met | load (1/5/15 min) |")
    print("|---|---|---:|---|---|---|")
    for what, d, goal in (("wall", d_wall, 0.4), ("CPU", d_cpu, 0.3)):
        print(f"| DistributedOptimizer step, MLP 32-64-64-1, batch 1024/rank: {what} per step over local | local "
              f"(no reduction) | +{d:.3f} ms | <= +{goal:g} ms | {'yes' if d <= goal else 'NO'} | {loads} |")


def run_single(steps: int, warmup: int) -> float:
    import torch

    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _batches(0)
    _loop(model, opt, data, warmup, lambda: None)
    return BATCH * steps / _loop(model, opt, data, steps, lambda: None), _cpu_ms_per_step[0]


def _ddp_worker(rank: int, size: int, port: int, steps: int, warmup: int) -> float:
    import torch
    import torch.distributed as dist

    ddp_kwargs = {}
    variant = os.environ.get("BENCH_DDP_VARIANT", "")
    if variant == "one-bucket":
        ddp_kwargs["bucket_cap_mb_list"] = [25]  # no small first bucket
    elif variant == "view":
        ddp_kwargs["gradient_as_bucket_view"] = True

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, wait_for_workers=True)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    try:
        model = torch.nn.parallel.DistributedDataParallel(make_model(), **ddp_kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = _batches(rank)
        _loop(model, opt, data, warmup, dist.barrier)
        elapsed = _loop(model, opt, data, steps, dist.barrier)
    finally:
        dist.destroy_process_group()
        _leave_together(store, rank, size)
    return size * BATCH * steps / elapsed, _cpu_ms_per_step[0]


def _hora_worker(rank: int, size: int, port: int, steps: int, warmup: int) -> float:
    import torch

    import hora.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    try:
        model = make_model()
        first = os.environ.get("BENCH_HORA_FIRST_BUCKET_MB")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if os.environ.get("BENCH_LOCKSTEP"):
            # (lockstep: the floor, but every rank waits for every other one before each
            # step, no data, as bench_fit_step's barrier floor: each step is as slow as the
            # slower rank's, and this host's two vCPUs do not run at one speed)
            opt.register_step_pre_hook(_lockstep_wait)
        elif not os.environ.get("BENCH_LOCAL"):  # (local: both ranks train at once, nothing reduced)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           first_bucket_mb=float(first) if first else None,
                                           gradient_as_bucket_view=not os.environ.get("BENCH_HORA_BY_NAME"))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        data = _batches(rank)
        _loop(model, opt, data, warmup, hvd.barrier)
        elapsed = _loop(model, opt, data, steps, hvd.barrier)
    finally:
        hvd.shutdown()
    return size * BATCH * steps / elapsed, _cpu_ms_per_step[0]


_LOCKSTEP: list = []  # the job's multiprocessing Barrier, in each rank's process


def _lockstep_wait(*_) -> None:
    _LOCKSTEP[0].wait(timeout=60)


def _child(target, rank, size, port, env, args, results, barrier) -> None:
    os.environ.update(env)
    _LOCKSTEP[:] = [barrier]
    try:
        results.put((rank, True, target(rank, size, port, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _leave_together(store, rank: int, size: int) -> None:
    """Rank 0 holds the TCPStore's server: it leaves only once every rank has torn its
    process group down (a rank still in ``destroy_process_group`` when the server went
    away waited for its store's timeout: one DDP run hung that way for 300 s)."""
    import datetime

    store.set(f"bench/left/{rank}", "1")
    store.wait([f"bench/left/{r}" for r in range(size)], datetime.timedelta(seconds=120))


def run_job(target, size: int, steps: int, warmup: int, timeout: float = 300.0,
            extra_env: dict[str, str] | None = None) -> tuple[float, float]:
    """Start ``size`` spawn processes on ``target``; return rank 0's first value
    (samples/s) and the mean over ranks of the second (CPU ms per step)."""
    from hora.native.rendezvous import RendezvousServer, WorkerEnv, make_secret

    ctx = mp.get_context("spawn")
    secret = make_secret()
    server = RendezvousServer(secret, host="127.0.0.1")
    server.start()
    port = _free_port()
    results = ctx.Queue()
    barrier = ctx.Barrier(size)  # (the lockstep configuration's)
    procs = []
    try:
        for rank in range(size):
            env = WorkerEnv.local(rank, size, server.addr, secret, job_id="bench", backend="gloo").to_environ()
            env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
            env.update(extra_env or {})
            p = ctx.Process(target=_child, args=(target, rank, size, port, env, (steps, warmup), results, barrier),
                            daemon=True)
            p.start()
            procs.append(p)
        out = {}
        deadline = time.monotonic() + timeout
        while len(out) < size:
            try:
                rank, ok, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{target.__name__}: ranks {sorted(set(range(size)) - set(out))} "
                                   f"did not finish within {timeout}s") from None
            if not ok:
                raise RuntimeError(f"{target.__name__} rank {rank} failed:\n{value}")
            out[rank] = value
        return out[0][0], statistics.mean(v[1] for v in out.values())
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        server.stop()


# name -> (label, worker, extra environment)
CONFIGS: dict[str, tuple[str, Any, dict[str, str]]] = {
    "single": ("one process", None, {}),
    # the floor of any data-parallel run on this machine: both ranks training at once with
    # the plain optimizer (nothing reduced; the samples/s of the slower rank times two)
    "local": ("both ranks at once, no reduction (the floor)", _hora_worker, {"BENCH_LOCAL": "1"}),
    # the same, the ranks meeting every step with no data (a synchronous job's floor)
    "lockstep": ("both ranks at once, meeting every step, no data (lockstep)", _hora_worker,
                 {"BENCH_LOCKSTEP": "1"}),
    "ddp": ("torch DDP gloo", _ddp_worker, {}),
    "hora": ("hora DistributedOptimizer", _hora_worker, {}),
    "hora-gloo": ("hora, HORA_SHM_ALLREDUCE=0 (Gloo over loopback, as DDP)", _hora_worker,
                  {"HORA_SHM_ALLREDUCE": "0"}),
    "hora-nospec": ("hora, HORA_SPECULATE=0", _hora_worker, {"HORA_SPECULATE": "0"}),
    "hora-first-1mb": ("hora, first_bucket_mb=1 (DDP's first bucket)", _hora_worker,
                       {"BENCH_HORA_FIRST_BUCKET_MB": "1"}),
    "hora-by-name": ("hora, gradient_as_bucket_view=False", _hora_worker, {"BENCH_HORA_BY_NAME": "1"}),
    "ddp-one-bucket": ("torch DDP gloo, one bucket", _ddp_worker, {"BENCH_DDP_VARIANT": "one-bucket"}),
    "ddp-view": ("torch DDP gloo, gradient_as_bucket_view=True", _ddp_worker, {"BENCH_DDP_VARIANT": "view"}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--only", choices=list(CONFIGS), action="append",
                        help="run only these configurations (repeatable)")
    parser.add_argument("--cycle-time-ms", type=float, action="append", default=[],
                        help="also run hora with HORA_CYCLE_TIME set to this (repeatable)")
    parser.add_argument("--model", choices=["both", "big", "small"], default="both",
                        help="the 16-layer MLP's table, the small model's, or both (default)")
    parser.add_argument("--small-steps", type=int, default=800, help="measured steps of the small model")
    args = parser.parse_args()
    if args.model != "big":
        run_small(args)
        if args.model == "small":
            return 0
    configs = args.only or ["single", "local", "lockstep", "ddp", "hora", "hora-gloo"]
    load = os.getloadavg()
    configs += [f"hora@{ms:g}" for ms in args.cycle_time_ms]
    runs: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            if c == "single":
                v = run_single(args.steps, args.warmup)
            elif "@" in c:
                v = run_job(_hora_worker, args.np, args.steps, args.warmup,
                            extra_env={"HORA_CYCLE_TIME": c.split("@", 1)[1]})
            else:
                target, env = CONFIGS[c][1:]
                v = run_job(target, args.np, args.steps, args.warmup, extra_env=env)
            v, cpu_ms = v
            runs[c].append(v)
            cpu[c].append(cpu_ms)
            print(f"round {r + 1}/{args.rounds} {c}: {v:,.0f} samples/s, {cpu_ms:.1f} CPU ms/step/rank",
                  file=sys.stderr, flush=True)
    med = {c: statistics.median(v) for c, v in runs.items()}
    labels = {c: f"{v[0]} ({args.np} ranks)" for c, v in CONFIGS.items()}
    labels["single"] = "one process (1 rank)"
    labels.update({c: f"hora, HORA_CYCLE_TIME={c.split('@')[1]} ms ({args.np} ranks)" for c in configs if "@" in c})
    print(f"\nMLP {DEPTH}x Linear({WIDTH},{WIDTH}), batch {BATCH}/rank, 1 thread/rank, "
          f"{args.steps} steps x {args.rounds} rounds (median)\n")
    print("| configuration | samples/s (sum over ranks) | runs | vs DDP | vs DDP, paired | vs one process "
          "| vs the floor, paired | CPU ms/step/rank |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for c in configs:
        vs_ddp = f"{med[c] / med['ddp']:.2f}x" if "ddp" in med else "-"
        # the median of each round's ratio to the DDP run of the same round: the rounds are
        # interleaved, so a slow drift of the machine cancels out
        paired = (f"{statistics.median(a / b for a, b in zip(runs[c], runs['ddp'])):.2f}x"
                  if "ddp" in runs else "-")
        vs_one = f"{med[c] / med['single']:.2f}x" if "single" in med else "-"
        vs_floor = (f"{statistics.median(a / b for a, b in zip(runs[c], runs['local'])):.2f}x"
                    if "local" in runs else "-")
        runs_s = ", ".join(f"{v / 1000:.1f}k" for v in runs[c])
        print(f"| {labels[c]} | {med[c]:,.0f} | {runs_s} | {vs_ddp} | {paired} | {vs_one} | {vs_floor} "
              f"| {statistics.median(cpu[c]):.1f} |")
    if "ddp" in runs:
        _goal_rows(runs, load)
    return 0


def _goal_rows(runs: dict[str, list[float]], load: tuple[float, float, float]) -> None:
    """The goal rows of benchmarks/README.md: each round's hora throughput over the DDP
    run of the same round (median of the rounds), with the load average at the start."""
    loads = "/".join(f"{x:.1f}" for x in load)
    print("\ngoal rows (benchmarks/README.md):\n")
    print("| measure (2 ranks, loopback, same run) | baseline | hora | goal | met | load (1/5/15 min) |")
    print("|---|---|---:|---|---|---|")
    for c, what, goal in (("hora", "", 1.5), ("hora-gloo", ", `HORA_SHM_ALLREDUCE=0` (Gloo as DDP)", 1.05)):
        if c in runs:
            ratio = statistics.median(a / b for a, b in zip(runs[c], runs["ddp"]))
            print(f"| DistributedOptimizer, CPU MLP {DEPTH} x Linear({WIDTH}), batch {BATCH}/rank{what} | DDP over "
                  f"Gloo | {ratio:.2f} x throughput | >= {goal:g} x | {'yes' if ratio >= goal else 'NO'} | {loads} |")
    if "local" in runs:
        # what the goal of 1.5 x DDP leaves: the floor (both ranks at once, nothing reduced)
        # against DDP in the same rounds; a ratio above it is out of reach for any reduction
        ceiling = statistics.median(a / b for a, b in zip(runs["local"], runs["ddp"]))
        print(f"\nthe floor (both ranks at once, nothing reduced) is {ceiling:.2f} x DDP in the same rounds: "
              f"no data-parallel run on this machine, now, can exceed that")
    if "lockstep" in runs:
        # a synchronous job also waits for the slower rank every step, whatever it reduces
        lock = statistics.median(a / b for a, b in zip(runs["lockstep"], runs["ddp"]))
        line = f"the lockstep floor (the same, meeting every step, no data) is {lock:.2f} x DDP"
        if "hora" in runs:
            line += (f"; hora is {statistics.median(a / b for a, b in zip(runs['hora'], runs['lockstep'])):.2f} x it"
                     " (paired)")
        print(line)


if __name__ == "__main__":
    sys.exit(main())
