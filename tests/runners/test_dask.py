"""hora.runners.run on a real Dask LocalCluster (2 worker processes)."""

from __future__ import annotations

import os
import signal
import time

import pytest

import hora.runners as hr
from hora.errors import ConfigError, RankError, RankKilledError, WorkerFailedError, WorkerLostError
from hora.runners import api as base

from .helpers import assert_no_workers_left

pytestmark = pytest.mark.dask


def _rank_env(x):
    keys = ["HORA_RANK", "HORA_LOCAL_RANK", "HORA_LOCAL_SIZE", "HORA_HOSTNAME", "HORA_RENDEZVOUS_ADDR"]
    return x + int(os.environ["HORA_RANK"]), {k: os.environ[k] for k in keys}


@pytest.mark.timeout(180)
def test_dask_results_in_rank_order_task_keys_and_secret(dask_client, monkeypatch):
    from distributed import get_task_stream

    secret = bytes(range(50, 82))
    monkeypatch.setattr(base, "make_secret", lambda: secret)
    with get_task_stream(dask_client) as stream:
        results = hr.run(_rank_env, args=(100,), backend="dask", client=dask_client, run_id="dask-ok", verbose=0)
    assert [r[0] for r in results] == [100, 101]
    envs = [r[1] for r in results]
    assert [e["HORA_LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["HORA_HOSTNAME"] for e in envs} == {"127.0.0.1"}
    assert len({e["HORA_RENDEZVOUS_ADDR"] for e in envs}) == 1
    keys = {t["key"] for t in stream.data}
    assert {"hora-dask-ok-rank0", "hora-dask-ok-rank1"} <= keys
    shown = repr(stream.data) + repr(keys)
    assert secret.hex() not in shown and repr(secret) not in shown
    # the two ranks ran on distinct workers
    workers = {t["worker"] for t in stream.data if str(t["key"]).startswith("hora-dask-ok")}
    assert len(workers) == 2
    assert_no_workers_left("dask-ok")


def _native_sum():
    import numpy as np

    import hora.native as hn

    return float(hn.allreduce(np.array([1.0 + hn.rank()]), op=hn.Sum, name="dask.sum")[0])


@pytest.mark.timeout(180)
def test_dask_native_allreduce_with_the_active_client(dask_client):
    assert hr.run(_native_sum, backend="dask", verbose=0) == [3.0, 3.0]  # num_proc defaults to the workers


def _fail_rank0():
    if os.environ["HORA_RANK"] == "0":
        raise OSError("dask rank 0 cannot open its data")
    time.sleep(120)


@pytest.mark.timeout(180)
def test_dask_failure_carries_the_remote_traceback(dask_client):
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_fail_rank0, backend="dask", client=dask_client, run_id="dask-fail", verbose=0)
    assert type(info.value) is RankError
    assert info.value.rank == 0
    assert "dask rank 0 cannot open its data" in info.value.remote_traceback
    assert_no_workers_left("dask-fail")
    # the cluster is usable again right away
    assert hr.run(_rank_env, args=(0,), backend="dask", client=dask_client, verbose=0)[1][0] == 1


def _kill_my_dask_worker():
    if os.environ["HORA_RANK"] == "1":
        os.kill(int(os.environ["HORA_SUPERVISOR_PID"]), signal.SIGKILL)  # the Dask worker process itself
    time.sleep(300)


@pytest.mark.timeout(240)
def test_dask_worker_killed_with_sigkill_fails_the_run(dask_client):
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_kill_my_dask_worker, backend="dask", client=dask_client, run_id="dask-kill", verbose=0)
    assert time.monotonic() - t0 < 60
    assert isinstance(info.value, (WorkerLostError, RankKilledError)) and info.value.retriable, type(info.value)
    assert info.value.rank == 1
    assert "died" in str(info.value) or "SIGKILL" in str(info.value)
    assert_no_workers_left("dask-kill", within=20)
    dask_client.wait_for_workers(2, timeout=120)  # the nanny restarts it


def test_dask_more_ranks_than_workers_fails_at_once(dask_client):
    with pytest.raises(ConfigError, match=r"num_proc=3 needs 3 distinct Dask workers .* has 2"):
        hr.run(_rank_env, args=(0,), num_proc=3, backend="dask", client=dask_client)


class _FakeScheduler:
    address = "tcp://10.0.0.1:8786"

    def __init__(self, workers):
        self.workers = workers

    def identity(self, n_workers=-1):
        return {"workers": self.workers if n_workers < 0 else dict(list(self.workers.items())[:n_workers])}


class _FakeClient:
    """Just enough of distributed.Client for worker selection (the launcher asks the scheduler's
    identity through ``sync``)."""

    def __init__(self, workers):
        self.scheduler = _FakeScheduler(workers)

    def scheduler_info(self, n_workers=-1):
        return self.scheduler.identity(n_workers)

    def sync(self, func, *args, **kwargs):
        return func(*args, **kwargs)


def test_dask_gpu_resource_is_honoured_where_workers_declare_it():
    from hora.runners.launchers.dask import DaskLauncher

    workers = {
        "tcp://10.0.0.2:1": {"host": "10.0.0.2", "resources": {}},
        "tcp://10.0.0.3:1": {"host": "10.0.0.3", "resources": {"GPU": 1}},
        "tcp://10.0.0.2:2": {"host": "10.0.0.2", "resources": {"GPU": 2}},
    }
    be = DaskLauncher(_FakeClient(workers))
    assert be.default_num_proc() == 2  # only the GPU workers
    assert [a for a, _ in be.pick_workers(2)] == ["tcp://10.0.0.2:2", "tcp://10.0.0.3:1"]
    with pytest.raises(ConfigError, match="num_proc=3 needs 3 distinct Dask workers"):
        be.check_num_proc(3)
    assert be.advertise_for("10.0.0.3") == "10.0.0.3"
    assert be.advertise_for("127.0.0.1") == "127.0.0.1"
    cpu_only = DaskLauncher(_FakeClient({k: {**v, "resources": {}} for k, v in workers.items()}))
    assert cpu_only.default_num_proc() == 3
