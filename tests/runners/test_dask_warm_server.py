"""A Dask worker's warm rank server outlives the worker process: the worker its nanny starts in
place of a killed one forks its ranks from the same server (torch imported), and the server ends
when the cluster closes (the workers closed, not killed)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

import hora.runners as hr

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]


def _origin() -> tuple[int, int]:
    """A rank's warm server (its parent) and its supervisor (the Dask worker process)."""
    return os.getppid(), int(os.environ["HORA_SUPERVISOR_PID"])


def test_the_server_outlives_a_killed_worker_serves_its_replacement_and_ends_with_the_cluster(tmp_path):
    pytest.importorskip("distributed")
    import dask
    from distributed import Client, LocalCluster

    env = {"PYTHONHASHSEED": "23"}  # a variable of the run's own: servers of their own
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None, silence_logs=40, local_directory=str(tmp_path))
    servers: set[int] = set()
    try:
        with Client(cluster) as client:
            first = hr.run(_origin, num_proc=2, backend="dask", client=client, env=env, verbose=0, run_id="dw-1")
            servers = {server for server, _ in first}
            assert len(servers) == 2 and servers.isdisjoint(w for _, w in first), first  # forked by servers
            server, worker = first[0]
            os.kill(worker, signal.SIGKILL)  # the nanny starts a worker of the same name in its place
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                pids = set(client.run(os.getpid, on_error="ignore").values())  # not the dead one's error
                if len(pids) == 2 and worker not in pids:
                    break
                time.sleep(0.2)
            else:
                pytest.fail("the nanny did not start a worker in place of the killed one")
            assert psutil.Process(server).is_running()  # the server outlived its worker
            again = hr.run(_origin, num_proc=2, backend="dask", client=client, env=env, verbose=0, run_id="dw-2")
            assert {s for s, _ in again} == servers, (first, again)  # both forked by the same servers
            assert worker not in {w for _, w in again}  # one of them for the replacement worker
    finally:
        cluster.close()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in servers if psutil.pid_exists(p)], timeout=30)
    assert not alive, f"warm servers {[p.pid for p in alive]} still run after the cluster closed"
