"""Faults in series, injected from outside (the short variant of ``benchmarks/chaos_soak.py``): a chaos thread
SIGKILLs a rank, then the executor JVM of a relaunched rank, then a rank again, all in ONE fit
on a real Spark standalone cluster (master + two workers); ``fit(max_failures=5)`` completes
with every epoch once and no rank process of the job is left."""

from __future__ import annotations

import os
import signal
import threading
import time

import pandas as pd
import psutil
import pytest
import torch

from hora.estimators.callbacks import Callback
from tests.estimators.frames import mlp, regression_data
from tests.runners.helpers import assert_no_workers_left, hora_worker_processes

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class SlowSteps(Callback):
    """Sleep after every batch so that the fit lasts long enough for faults from outside."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_batch_end(self, ctx, step, logs):
        time.sleep(self.seconds)


def _executor_of(pids: set[int]) -> psutil.Process | None:
    """An executor JVM running a task of the fit: one with one of ``pids`` among its descendants,
    else (ranks started by a warm rank server are not the JVM's children) one with a python task
    process under it."""
    busy = None
    for proc in psutil.Process().children(recursive=True):  # this test's cluster, not another pytest process's
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(proc.cmdline()):
                below = proc.children(recursive=True)
                if pids & {c.pid for c in below}:
                    return proc
                if busy is None and any("python" in " ".join(c.cmdline()) for c in below):
                    busy = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return busy


def chaos(run_id: str, plan: list[str], injected: list[tuple[str, int]], stop: threading.Event,
          settle: float = 2.0) -> None:
    """For each target in ``plan`` ("rank" or "executor"): wait for ranks of ``run_id`` that were
    not there at the previous fault (relaunched ones), let them train ``settle`` s, SIGKILL one or
    its executor JVM. A fault counts only when the kill hit a live process; a miss is tried again."""
    seen: set[int] = set()
    plan = list(plan)
    while plan and not stop.is_set():
        fresh = [p for p in hora_worker_processes(run_id) if p.pid not in seen]
        if not fresh:
            time.sleep(0.1)
            continue
        if stop.wait(settle):
            return
        try:
            victim = fresh[-1] if plan[0] == "rank" else _executor_of({p.pid for p in fresh})
            if victim is None or not victim.is_running():
                continue
            seen.update(p.pid for p in hora_worker_processes(run_id))
            os.kill(victim.pid, signal.SIGKILL)
            injected.append((plan.pop(0), victim.pid))
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue


@pytest.mark.timeout(600)
def test_a_standalone_fit_survives_three_faults_in_series(standalone_connect, tmp_path):
    import hora.runners as hr
    from hora.spark import TorchEstimator
    from hora.store import Store

    _, spark = standalone_connect
    x, y = regression_data(n=128)
    df = spark.createDataFrame(pd.DataFrame({"features": [row.tolist() for row in x], "y": y}))
    net = mlp()
    run_id, epochs = "faults-in-series", 8
    injected: list[tuple[str, int]] = []
    stop = threading.Event()
    thread = threading.Thread(target=chaos, args=(run_id, ["rank", "executor", "rank"], injected, stop),
                              daemon=True)
    thread.start()
    try:
        fit = TorchEstimator(
            backend=hr.SparkLauncher(spark, task_cpus=2),
            store=Store.create(str(tmp_path / "store")), model=net,
            optimizer=torch.optim.Adam(net.parameters(), lr=0.01), loss=torch.nn.MSELoss(),
            feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=epochs, random_seed=0,
            verbose=0, max_failures=5, start_timeout=240, checkpoint_every="2 steps", run_id=run_id,
            callbacks=[SlowSteps(0.3)],
        ).fit(df)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert [kind for kind, _ in injected] == ["rank", "executor", "rank"], injected
    epochs_seen = [h["epoch"] for h in fit.getHistory()]
    assert epochs_seen == list(range(epochs)), epochs_seen
    assert fit.getHistory()[-1]["attempt"] == 4, fit.getHistory()
    assert_no_workers_left(run_id, within=30)
