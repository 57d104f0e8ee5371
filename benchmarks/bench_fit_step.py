"""``hora.dask.TorchEstimator.fit`` of a small MLP on tabular data: the step's overhead and the job's fixed costs.

Run: ``.venv/bin/python benchmarks/bench_fit_step.py [--rows 1000000] [--cols 32] [--epochs 3] [--fits 2]``.

The fit of the goal rows in benchmarks/README.md: ``--rows`` x ``--cols`` float32 features (one feature
group, stacked into ``(rows, cols)``) and a label, a Dask ``LocalCluster`` of 2 worker
processes (1 thread each), ``num_proc=2``, MLP ``cols-64-64-1``, SGD, MSE, batch 1024 per
rank, ``--epochs`` epochs, shuffled, one checkpoint per epoch (the default). The first fit
materializes the dataset; later fits reuse it (the numbers of the goal are those of a
reused dataset).

Measured in the same run:

* the compute floor: one process, one thread (``torch.set_num_threads(1)``), the same
  MLP and optimizer over all rows x epochs in batches of 1024 from in-memory tensors,
  halved (each rank trains half the rows);
* two processes at once, each that loop over its half of the rows, with no reduction: what
  the machine's two cores give two ranks that never communicate; the same meeting at a
  barrier every step (lockstep with no data: what waiting for the slower of two ranks
  costs by itself on this machine); and the same reducing their gradients by hand every
  step (``torch.cat``, one ``torch.distributed.all_reduce`` over Gloo, copy back: the
  least a synchronous data-parallel loop written with torch alone does);
* the time inside the epochs (the ranks' ``epoch_time_s``, summed; rank 0's view) as a
  ratio to the floor; and, for each fit on the reused dataset, to the two-at-once floor
  measured again right before it (this machine's speed drifts by up to 2x within
  minutes: the ratio to the floor next to the fit is the one to read);
* the worker job (the driver's ``train_s``) minus the epochs, broken down with the
  wall-clock stamps rank 0 returns (``phases``): process start and imports (the driver
  starts the job -> rank 0's payload unpickled), rendezvous (``hora.native.init``),
  session open and initial broadcast, checkpoints and epoch ends (after each epoch's
  timer stops), and the result (rank 0's function returned -> the driver has it).

With ``--warm both`` (the default) every fit on the reused dataset runs twice, with fresh
rank processes (``HORA_WARM_WORKERS=0``) and then with ranks forked from the Dask workers'
warm servers (:mod:`hora.runners.rank.warm.client`), so the before/after of the fixed costs is one run.

A third table splits rank 0's step into its parts (the worker's epoch profiles: batch
wait, forward + loss, backward, optimizer step, the rest), in ms per step.

Prints markdown tables and the load average. Takes about a minute and a half on an idle
2-core machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_estimator import make_mlp  # noqa: E402  (the same MLP as the Spark fit's benchmark)


def compute_floor(x, y, epochs: int, batch: int, lr: float, sync=None) -> float:
    """Seconds for one thread to train the MLP on all rows x ``epochs`` (shuffled batches
    from memory). ``sync(model)``, when given, runs after each backward pass (before the
    optimizer step): what a data-parallel rank must at least add to its step."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_mlp(x.shape[1])
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        loss_fn = torch.nn.MSELoss()
        t0 = time.perf_counter()
        for epoch in range(epochs):
            order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch))
            for start in range(0, x.shape[0], batch):
                idx = order[start:start + batch]
                opt.zero_grad()
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                if sync is not None:
                    sync(model)
                opt.step()
                float(loss.detach())  # the estimator reads every step's loss too
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)


def _floor_half(rows: int, cols: int, part: int, epochs: int, batch: int, lr: float, barrier, out,
                mode: str = "none", port: int = 0) -> None:
    """One of :func:`parallel_floor`'s two processes: :func:`compute_floor` on half the rows.

    ``mode`` "none": no communication; "barrier": the two meet at a barrier every step (no
    data: what lockstep alone costs); "gloo": every step the gradients are reduced by hand,
    fused (``torch.cat``, one ``torch.distributed.all_reduce`` over Gloo, copy back)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    x = rng.random((rows, cols), dtype=np.float32)
    y = x.sum(axis=1, dtype=np.float32)
    half = slice(0, rows // 2) if part == 0 else slice(rows // 2, rows)
    xt, yt = torch.from_numpy(x[half].copy()), torch.from_numpy(y[half].copy()).reshape(-1, 1)
    del x, y
    sync = None
    if mode == "barrier":
        def sync(model) -> None:
            barrier.wait(timeout=300)
    elif mode == "gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=part, world_size=2,
                                timeout=__import__("datetime").timedelta(seconds=300))

        def sync(model) -> None:
            grads = [p.grad for p in model.parameters()]
            fused = torch.cat([g.view(-1) for g in grads])
            dist.all_reduce(fused)
            fused.div_(2)
            torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(fused.split([g.numel() for g in grads]),
                                                                       grads)])
    barrier.wait(timeout=300)
    try:
        out.put((part, compute_floor(xt, yt, epochs, batch, lr, sync)))
    finally:
        if mode == "gloo":
            barrier.wait(timeout=300)  # (the rank that holds the store leaves last)
            dist.destroy_process_group()


def parallel_floor(rows: int, cols: int, epochs: int, batch: int, lr: float, mode: str = "none") -> float:
    """Seconds for two processes at once, one thread each, to train the MLP on their half
    of the rows x ``epochs`` each (the slower of the two), with no reduction at all (what
    this machine's two cores give two ranks that never communicate), or ``mode``
    "barrier" / "gloo" (see :func:`_floor_half`)."""
    import multiprocessing as mp
    import socket

    port = 0
    if mode == "gloo":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_floor_half, args=(rows, cols, part, epochs, batch, lr, barrier, out, mode, port))
             for part in (0, 1)]
    for p in procs:
        p.start()
    try:
        times = [out.get(timeout=600)[1] for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return max(times)


def breakdown(timings: dict, phases: dict, driver_start: float) -> dict[str, float]:
    """The worker job's seconds outside the epochs, by phase (rank 0's wall-clock stamps)."""
    epochs = phases["epochs"]
    out = {
        "start + imports": phases["payload_loaded"] - driver_start,
        "rendezvous (native init)": phases["native_init"] - phases["payload_loaded"],
        "session open + broadcast": phases["train_begin"] - phases["native_init"],
        "checkpoints + epoch ends": sum(e["after"] - e["end"] for e in epochs),
        "between epochs (reader setup)": sum(b["start"] - a["after"] for a, b in zip(epochs, epochs[1:]))
        + (epochs[0]["start"] - phases["train_begin"]),
        "train end + result": (driver_start + timings["train_s"]) - epochs[-1]["after"],
    }
    return out


def step_profile(phases: dict) -> dict[str, float]:
    """Milliseconds per step of each part of rank 0's steps, over all epochs (the worker's
    epoch profiles): waiting for the batch (each epoch's first one apart), the Torch
    step's forward + loss, backward (gradient hooks included) and optimizer step (the
    wait for the gradient allreduce included), and the loop's own bookkeeping."""
    profiles = [e["profile"] for e in phases["epochs"]]
    steps = sum(p["steps"] for p in profiles) or 1
    total = {k: sum(p.get(k, 0.0) for p in profiles) for k in profiles[0] if k != "steps"}
    epochs_s = sum(e["end"] - e["start"] for e in phases["epochs"])
    inner = ("train_step.forward+loss", "train_step.backward", "train_step.optimizer")
    out = {
        "batch wait (after each epoch's first)": total["batch_wait"] - total["first_batch_wait"],
        "forward + loss": total[inner[0]],
        "backward (gradient hooks included)": total[inner[1]],
        "optimizer step (allreduce wait included)": total[inner[2]],
        "rest of train_step (tensors, loss value)": total["train_step"] - sum(total[k] for k in inner),
        "loop bookkeeping (callbacks, reports, epoch-end metrics)": epochs_s - total["batch_wait"] - total["train_step"],
    }
    out = {k: 1000 * v / steps for k, v in out.items()}
    out["each epoch's first batch (ms, once an epoch)"] = 1000 * total["first_batch_wait"] / len(profiles)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--fits", type=int, default=2, help="fits in a row (the first materializes the dataset)")
    ap.add_argument("--warm", choices=("both", "on", "off"), default="both",
                    help="ranks forked from a warm server (HORA_WARM_WORKERS=1), fresh processes (0), or, with "
                         "both, each reused-dataset fit twice: fresh, then warm (one run, the same workers)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import dask.dataframe as dd
    import numpy as np
    import pandas as pd
    import torch
    from distributed import Client, LocalCluster

    from hora.dask import TorchEstimator
    from hora.estimators.driver import fit as core
    from hora.store import Store

    rng = np.random.default_rng(0)
    x = rng.random((args.rows, args.cols), dtype=np.float32)
    y = x.sum(axis=1, dtype=np.float32)
    names = [f"f{i}" for i in range(args.cols)]
    pdf = pd.DataFrame(x, columns=names)
    pdf["y"] = y
    load_before = os.getloadavg()
    floor = compute_floor(torch.from_numpy(x), torch.from_numpy(y).reshape(-1, 1), args.epochs, args.batch_size,
                          args.lr)
    per_rank = floor / 2
    both = parallel_floor(args.rows, args.cols, args.epochs, args.batch_size, args.lr)
    lockstep = parallel_floor(args.rows, args.cols, args.epochs, args.batch_size, args.lr, "barrier")
    by_hand = parallel_floor(args.rows, args.cols, args.epochs, args.batch_size, args.lr, "gloo")

    tmp = tempfile.mkdtemp(prefix="hora-bench-fitstep-")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=":0", silence_logs=40)
    client = Client(cluster)
    runs = []
    pairs: list[float] = []  # the two-at-once floor measured right before each fit on the reused dataset
    try:
        ddf = dd.from_pandas(pdf, npartitions=4)
        store = Store.create(os.path.join(tmp, "store"))
        plan = [(0, "0" if args.warm == "off" else "1")]
        for i in range(1, args.fits):
            plan += [(i, "0"), (i, "1")] if args.warm == "both" else [(i, "1" if args.warm == "on" else "0")]
        for i, warm in plan:
            net = make_mlp(args.cols)
            est = TorchEstimator(
                num_proc=2, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=args.lr),
                loss=torch.nn.MSELoss(), feature_cols=[names], label_cols=["y"], batch_size=args.batch_size,
                epochs=args.epochs, shuffle=True, verbose=0, random_seed=0,
                backend_env={"HORA_WARM_WORKERS": warm},
            )
            # what est.fit does, keeping rank 0's whole result (its phase stamps) for the breakdown
            config = est._config()
            if i > 0:
                # the two-at-once floor again, right before this fit: the machine's speed drifts
                # within minutes, so the fit's ratio to the floor next to it is the one to read
                pairs.append(parallel_floor(args.rows, args.cols, args.epochs, args.batch_size, args.lr))
            t0 = time.perf_counter()
            result = core.fit(ddf, config, est.framework, client=client)
            done_wall = time.time()
            elapsed = time.perf_counter() - t0
            tm = result.extra["timings"]
            driver_start = done_wall - tm["collect_s"] - tm["train_s"]
            runs.append((i, warm, elapsed, tm, breakdown(tm, result.extra["phases"], driver_start),
                         result.history[-1]["loss"], step_profile(result.extra["phases"])))
    finally:
        client.close()
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    print(f"\n### fit, {args.rows:,} rows x {args.cols} features, MLP {args.cols}-64-64-1, 2 ranks (Dask LocalCluster), "
          f"{args.epochs} epochs, batch {args.batch_size}/rank\n")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n")
    print(f"compute floor: one thread, all rows x {args.epochs} epochs = {floor:.2f} s; per rank (half) "
          f"{per_rank:.2f} s\n")
    print(f"two processes at once, each its half of the rows x {args.epochs} epochs, no reduction (the slower): "
          f"{both:.2f} s ({both / per_rank:.2f} x the per-rank floor)\n")
    print(f"the same, the two meeting at a barrier every step (lockstep, no data): {lockstep:.2f} s; "
          f"reducing their gradients by hand every step (cat, one Gloo all_reduce, copy back): {by_hand:.2f} s\n")
    steps = args.epochs * -(-args.rows // 2 // args.batch_size)
    print("| fit | seconds | epochs s (goal <= 2.0) | epochs / floor | epochs / two at once | epochs / lockstep "
          "| epochs / by hand | ms per step (floor) | job - epochs s (goal <= 1.5) | final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    def label(i: int, warm: str) -> str:
        return ("first (materializes)" if i == 0 else f"{i + 1}: dataset reused") + (", warm" if warm == "1" else
                                                                                     ", fresh processes")

    for i, warm, elapsed, tm, parts, loss, _ in runs:
        print(f"| {label(i, warm)} | {elapsed:.2f} | {tm['epochs_s']:.2f} | {tm['epochs_s'] / per_rank:.2f} | "
              f"{tm['epochs_s'] / both:.2f} | {tm['epochs_s'] / lockstep:.2f} | {tm['epochs_s'] / by_hand:.2f} | "
              f"{1000 * tm['epochs_s'] / steps:.2f} ({1000 * per_rank / steps:.2f}) | "
              f"{tm['train_s'] - tm['epochs_s']:.2f} | {loss:.4g} |")
    print("\nworker job minus the epochs, by phase (seconds; rank 0's stamps):\n")
    print("| phase | " + " | ".join(label(i, warm) for i, warm, *_ in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for key in runs[-1][4]:
        print(f"| {key} | " + " | ".join(f"{r[4].get(key, float('nan')):.2f}" for r in runs) + " |")
    print("| **job - epochs** | " + " | ".join(f"**{r[3]['train_s'] - r[3]['epochs_s']:.2f}**" for r in runs) + " |")
    reused = [r for r in runs if r[0] > 0]
    if pairs and len(pairs) == len(reused):
        print("\neach fit on the reused dataset against the two-at-once floor measured right before it:\n")
        print("| fit | two at once, just before (s) | epochs (s) | epochs / two at once |")
        print("|---|---:|---:|---:|")
        for (i, warm, _, tm, *_rest), both_now in zip(reused, pairs):
            print(f"| {label(i, warm)} | {both_now:.2f} | {tm['epochs_s']:.2f} | {tm['epochs_s'] / both_now:.2f} |")
    floor_ms = 1000 * per_rank / steps
    print(f"\na step, by part (ms per step, rank 0's epoch profiles, all epochs; the floor's whole step is "
          f"{floor_ms:.2f} ms):\n")
    print("| part | " + " | ".join(label(i, warm) for i, warm, *_ in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for key in runs[-1][6]:
        print(f"| {key} | " + " | ".join(f"{r[6].get(key, float('nan')):.3f}" for r in runs) + " |")


if __name__ == "__main__":
    main()
