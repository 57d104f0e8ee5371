"""Faults in series on ``hora run -H`` hosts (the short variant of ``benchmarks/chaos_soak.py``'s ssh scenario): one fit of a
TorchEstimator on two hosts over a real sshd (127.0.0.1 directly, 127.0.0.2 over ssh) survives
a rank SIGKILLed on the second host, then that host's rank supervisor (the process ssh started),
then a rank on the first host; ``fit(max_failures=5)`` completes with every epoch once, and no
rank or supervisor of the job is left on either host."""

from __future__ import annotations

import os
import signal
import threading
import time

import pandas as pd
import psutil
import pytest
import torch

from tests.estimators.frames import mlp, regression_data
from tests.estimators.test_faults_in_series import SlowSteps
from tests.runners.helpers import rank_processes_in

pytestmark = [pytest.mark.slow]


def _job_processes(marker: str) -> list[tuple[str, str, psutil.Process]]:
    """``(kind, host, process)`` of the job's ranks ("rank") and remote supervisors ("supervisor"),
    started in the folder ``marker``: the second host's are the supervisor ssh started and what
    runs under it."""
    out = []
    for proc in rank_processes_in(marker):
        try:
            remote = [p for p in [proc, *proc.parents()] if "hora.runners.rank.remote" in " ".join(p.cmdline())]
            kind = "supervisor" if "hora.runners.rank.remote" in " ".join(proc.cmdline()) else "rank"
            out.append((kind, "127.0.0.2" if remote else "127.0.0.1", proc))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def chaos(marker: str, plan: list[tuple[str, str]], injected: list[tuple[str, str]], stop: threading.Event,
          settle: float = 2.0) -> None:
    """For each ``(kind, host)`` of ``plan``: wait for processes of the job that were not there at
    the previous fault (the relaunched ones), let them train ``settle`` s, SIGKILL the one of that
    kind on that host. A fault counts only when the kill hit a live process."""
    seen: set[int] = set()
    plan = list(plan)
    while plan and not stop.is_set():
        fresh = [(k, h, p) for k, h, p in _job_processes(marker) if p.pid not in seen]
        kind, host = plan[0]
        targets = [p for k, h, p in fresh if (k, h) == (kind, host)]
        if not targets or not any(k == "rank" for k, _, _ in fresh):
            time.sleep(0.1)
            continue
        if stop.wait(settle):
            return
        try:
            if not targets[0].is_running():
                continue
            seen.update(p.pid for _, _, p in _job_processes(marker))
            os.kill(targets[0].pid, signal.SIGKILL)
            injected.append(plan.pop(0))
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue


@pytest.mark.timeout(600)
def test_a_fit_on_two_ssh_hosts_survives_three_faults_in_series(sshd, tmp_path, monkeypatch):
    from hora.dask import TorchEstimator
    from hora.runners import HostsLauncher
    from hora.runners.rank.ssh import SshOptions
    from hora.store import Store

    monkeypatch.setenv("HORA_SSH_ARGS", sshd.env["HORA_SSH_ARGS"])
    monkeypatch.chdir(tmp_path)
    x, y = regression_data(n=128)
    net = mlp()
    run_id, epochs = "ssh-faults-in-series", 8
    plan = [("rank", "127.0.0.2"), ("supervisor", "127.0.0.2"), ("rank", "127.0.0.1")]
    injected: list[tuple[str, str]] = []
    stop = threading.Event()
    thread = threading.Thread(target=chaos, args=(str(tmp_path), plan, injected, stop), daemon=True)
    thread.start()
    try:
        fit = TorchEstimator(
            backend=HostsLauncher("127.0.0.1:1,127.0.0.2:1", ssh=SshOptions(port=sshd.port, identity_file=sshd.key)),
            num_proc=2, store=Store.create(str(tmp_path / "store")), model=net,
            optimizer=torch.optim.Adam(net.parameters(), lr=0.01), loss=torch.nn.MSELoss(),
            feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=epochs, random_seed=0,
            verbose=0, max_failures=5, checkpoint_every="2 steps", run_id=run_id, callbacks=[SlowSteps(0.3)],
        ).fit(pd.DataFrame({"features": list(x), "y": y}))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert injected == plan, injected
    history = fit.history_
    assert [h["epoch"] for h in history] == list(range(epochs)), history
    assert history[-1]["attempt"] == 4 and history[-1]["num_proc"] == 2, history
    deadline = time.monotonic() + 30
    while _job_processes(str(tmp_path)):
        assert time.monotonic() < deadline, f"left behind: {_job_processes(str(tmp_path))}"
        time.sleep(0.2)
