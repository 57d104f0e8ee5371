"""A lost driver: the process that called ``fit`` is SIGKILLed mid-training on a Dask cluster
started from the command line (``dask scheduler`` and two ``dask worker`` processes). Every rank
exits within HORA_HEARTBEAT_TIMEOUT plus a few seconds, and the workers stay up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]

HEARTBEAT_TIMEOUT = 6

FIT = r'''
import sys, numpy as np, pandas as pd, torch
import dask.dataframe as dd
from distributed import Client
from hora.dask import TorchEstimator
from hora.store import Store

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        import time
        time.sleep(0.02)
        return self.lin(x)

if __name__ == "__main__":
    client = Client(sys.argv[1])
    x = np.random.default_rng(0).normal(size=(4000, 4)).astype("float32")
    pdf = pd.DataFrame({"features": list(x), "y": x.sum(axis=1)})
    net = Slow()
    est = TorchEstimator(num_proc=2, store=Store.create(sys.argv[2]), model=net,
                         optimizer=torch.optim.SGD(net.parameters(), 0.01), loss=torch.nn.MSELoss(),
                         feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=40, verbose=0)
    est.fit(dd.from_pandas(pdf, npartitions=2))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks_under(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                try:
                    if "hora.runners.worker" in " ".join(child.cmdline()):
                        found.append(child)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    return found


def test_ranks_exit_when_the_fit_process_is_killed(tmp_path):
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               HORA_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT), HORA_WARM_WORKERS="0")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for i in range(2):
            procs.append(subprocess.Popen([os.path.join(bindir, "dask"), "worker", address, "--nthreads", "1",
                                           "--nworkers", "1", "--no-dashboard", "--local-directory",
                                           str(tmp_path / f"w{i}")], env=env, cwd=tmp_path,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        script = tmp_path / "fit.py"
        script.write_text(textwrap.dedent(FIT))
        fit = subprocess.Popen([sys.executable, str(script), address, str(tmp_path / "store")], env=env,
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        workers = [p.pid for p in procs[1:]]
        deadline = time.monotonic() + 150
        while len(_ranks_under(workers)) < 2:  # training has started on both workers
            assert fit.poll() is None, fit.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.5)
        time.sleep(2)
        ranks = _ranks_under(workers)
        fit.send_signal(signal.SIGKILL)
        fit.wait()
        killed_at = time.monotonic()
        gone, alive = psutil.wait_procs(ranks, timeout=HEARTBEAT_TIMEOUT + 20)
        assert not alive, f"rank processes still running {time.monotonic() - killed_at:.0f} s after the driver died: " \
                          f"{[p.pid for p in alive]}"
        assert all(p.poll() is None for p in procs), "a Dask worker or the scheduler went down with the driver"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for leftover in _ranks_under([p.pid for p in procs]):
            leftover.kill()
