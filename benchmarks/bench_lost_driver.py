"""A lost driver on Dask: from its ranks' exit to a refit's first epoch on the same cluster.

A Dask cluster started from the command line (``dask scheduler`` and two one-thread ``dask
worker`` processes, as ``tests/runners/test_lost_driver.py`` starts it). A fit (2 ranks, a
model that sleeps 20 ms a batch) runs in its own process; after its first checkpoint that
process is SIGKILLed. A second process, started beforehand with its imports done and its
``Client`` connected, waits; the moment the last rank process of the killed fit has exited it
refits with the same ``run_id`` (it resumes from the checkpoint). Measured: from the ranks' exit
until every rank of the refit has begun its first epoch (a callback's stamp).

Also: the kill until the ranks' exit, and, as the floor, the same refit process's go until its
first epoch on an idle cluster (a fresh ``run_id``, nothing killed before it).

    python benchmarks/bench_lost_driver.py [--repeats 3] [--heartbeat-timeout 30]

Prints a markdown table of medians, each row's figures per repeat on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port  # noqa: E402
from _common.processes import ranks_under  # noqa: E402

FIT = r'''
import json, logging, os, sys, time, numpy as np, pandas as pd, torch
import dask.dataframe as dd
from distributed import Client
from hora.dask import TorchEstimator
from hora.estimators.callbacks import Callback
from hora.store import Store

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        time.sleep(0.02)
        return self.lin(x)

class Stamp(Callback):  # every rank's first epoch begin: <folder>/<run id>.<rank> = time.time()
    def __init__(self, folder, run_id):
        self.folder, self.run_id = folder, run_id
    def on_epoch_begin(self, ctx, epoch):
        name = os.path.join(self.folder, f"{self.run_id}.{ctx.rank}")
        if not os.path.exists(name):
            with open(name + ".tmp", "w") as fh:
                fh.write(repr(time.time()))
            os.replace(name + ".tmp", name)

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    address, store, run_id, epochs, folder = sys.argv[1:6]
    client = Client(address)
    client.wait_for_workers(2, timeout=120)
    x = np.random.default_rng(0).normal(size=(2000, 4)).astype("float32")
    pdf = pd.DataFrame({"features": list(x), "y": x.sum(axis=1)})
    net = Slow()
    est = TorchEstimator(num_proc=2, store=Store.create(store), model=net, run_id=run_id,
                         optimizer=torch.optim.SGD(net.parameters(), 0.01), loss=torch.nn.MSELoss(),
                         feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=int(epochs),
                         verbose=0, callbacks=[Stamp(folder, run_id)])
    ddf = dd.from_pandas(pdf, npartitions=2)
    if len(sys.argv) > 6:  # wait for the word to go, imports done, connected, the estimator made
        print("ready", flush=True)
        sys.stdin.readline()
        with open(os.path.join(folder, f"{run_id}.go"), "w") as fh:
            fh.write(repr(time.time()))
    model = est.fit(ddf)
    print("HISTORY=" + json.dumps([h["epoch"] for h in model.history_]), flush=True)
'''


def _wait_for(path: Path, timeout: float, proc: subprocess.Popen) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the fit process ended ({proc.returncode}) before {path.name}: "
                               f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout:.0f} s")
        time.sleep(0.02)
    return float(path.read_text())


class Cluster:
    """``dask scheduler`` and two ``dask worker`` processes (one thread each) on 127.0.0.1."""

    def __init__(self, work: Path, env: dict) -> None:
        bindir = os.path.dirname(sys.executable)
        port = free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env, "cwd": work}
        self.procs = [subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                                        str(port), "--dashboard-address", ":0"], **quiet)]
        for i in range(2):
            self.procs.append(subprocess.Popen([os.path.join(bindir, "dask"), "worker", self.address, "--nthreads",
                                                "1", "--nworkers", "1", "--no-dashboard", "--local-directory",
                                                str(work / f"w{i}")], **quiet))
        self.workers = [p.pid for p in self.procs[1:]]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for leftover in ranks_under([p.pid for p in self.procs]):
            leftover.kill()


def _start_waiting(script: Path, cluster: Cluster, store: str, run_id: str, epochs: int, folder: Path,
                   env: dict, work: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(script), cluster.address, store, run_id, str(epochs), str(folder),
                             "wait"], env=env, cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"the refit process did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def _go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0 or "HISTORY=" not in out:
        raise RuntimeError(f"the refit failed ({proc.returncode}): {err[-3000:]}")


def one(cluster: Cluster, script: Path, work: Path, env: dict, i: int) -> dict[str, float]:
    """One lost driver and its refit; and one refit of a fresh run on the idle cluster (the floor)."""
    from hora.store import Store

    folder = work / f"stamps{i}"
    folder.mkdir()
    store_url = f"file://{work / f'store{i}'}"
    store = Store.create(store_url)
    run_id = f"lost-driver-bench-{i}"
    refit = _start_waiting(script, cluster, store_url, run_id, 4, folder, env, work)
    try:
        killed_stamps = work / f"killed{i}"  # the killed fit's stamps: not the refit's
        killed_stamps.mkdir()
        fit = subprocess.Popen([sys.executable, str(script), cluster.address, store_url, run_id, "40",
                                str(killed_stamps)],
                               env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while len(ranks_under(cluster.workers)) < 2 or not store.list_checkpoints(run_id):
            if fit.poll() is not None:
                raise RuntimeError(f"the fit ended early: {fit.stderr.read()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("the ranks never started or never wrote a checkpoint")
            time.sleep(0.2)
        ranks = ranks_under(cluster.workers)
        killed = time.time()
        fit.send_signal(signal.SIGKILL)
        fit.wait()
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks):
            time.sleep(0.02)
            if time.time() - killed > 300:
                raise TimeoutError("the ranks did not exit within 300 s of the driver's kill")
        exited = time.time()
        _go(refit)
        first = max(_wait_for(folder / f"{run_id}.{r}", 300, refit) for r in (0, 1))
        _finish(refit)
    finally:
        if refit.poll() is None:
            refit.kill()
            refit.wait()
    # the floor: the same waiting refit process on an idle cluster, for a new run
    fresh = f"idle-bench-{i}"
    idle = _start_waiting(script, cluster, store_url, fresh, 1, folder, env, work)
    try:
        _go(idle)
        idle_first = max(_wait_for(folder / f"{fresh}.{r}", 300, idle) for r in (0, 1))
        go = float((folder / f"{fresh}.go").read_text())
        _finish(idle)
    finally:
        if idle.poll() is None:
            idle.kill()
            idle.wait()
    return {"ranks_exit": exited - killed, "first_epoch": first - exited,
            "idle_first_epoch": idle_first - go}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", type=float, default=None,
                        help="HORA_HEARTBEAT_TIMEOUT for the cluster and the fits (default: hora's)")
    args = parser.parse_args()
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if args.heartbeat_timeout is not None:
        env["HORA_HEARTBEAT_TIMEOUT"] = str(args.heartbeat_timeout)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hora-bench-lost-driver-") as tmp:
        work = Path(tmp)
        script = work / "fit.py"
        script.write_text(textwrap.dedent(FIT))
        cluster = Cluster(work, env)
        try:
            for i in range(args.repeats):
                row = one(cluster, script, work, env, i)
                print(f"repeat {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), file=sys.stderr)
                rows.append(row)
        finally:
            cluster.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1/5/15 min) at the end: {load}; median of {args.repeats}\n")
    print("| kill -> ranks exited s | ranks exited -> refit's first epoch s "
          "| refit on an idle cluster: go -> first epoch s |")
    print("|---:|---:|---:|")
    print(f"| {med['ranks_exit']:.2f} | {med['first_epoch']:.2f} | "
          f"{med['idle_first_epoch']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
