"""Device pinning (pure mapping, tested with fake inputs) and the driver-side use_gpu checks, on CPU."""
from __future__ import annotations

import logging
import socket

import pandas as pd
import pytest
import torch

from hora.errors import ConfigError
from hora.estimators.devices import check_gpus_before_launch, pick_device_index

pytestmark = pytest.mark.timeout(120)


def _pick(**kw):
    args = dict(rank=0, local_rank=0, local_size=1, device_count=1)
    args.update(kw)
    return pick_device_index(**args)


@pytest.mark.parametrize("local_rank,expected", [(0, 0), (1, 1), (3, 3)])
def test_local_rank_indexes_visible_devices(local_rank, expected):
    assert _pick(rank=10 + local_rank, local_rank=local_rank, local_size=4, device_count=4) == expected


def test_more_ranks_than_gpus_names_rank_and_devices():
    with pytest.raises(ConfigError, match=r"rank 5 \(local rank 1\).*2 ranks.*1 CUDA device.*cuda:0"):
        _pick(rank=5, local_rank=1, local_size=2, device_count=1)


def test_explicit_sharing_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="hora.estimators.devices"):
        assert _pick(rank=1, local_rank=1, local_size=2, device_count=1, allow_sharing=True) == 0
    assert "shares cuda:0" in caplog.text


def test_no_device_names_rank_and_host():
    with pytest.raises(ConfigError, match=rf"rank 3 on host {socket.gethostname()} sees no CUDA device"):
        _pick(rank=3, device_count=0)


def test_spark_task_address_translated_through_cuda_visible_devices():
    # the executor sees physical GPUs 4,6,7 as cuda:0..2; the task was given physical GPU 6
    assert _pick(local_rank=0, local_size=3, device_count=3, visible_devices="4,6,7",
                 task_gpu_addresses=["6"]) == 1
    # no CUDA_VISIBLE_DEVICES: the address is the index; the local rank does not matter
    assert _pick(local_rank=0, local_size=2, device_count=2, task_gpu_addresses=["1"]) == 1


def test_spark_task_address_not_visible_is_an_error():
    with pytest.raises(ConfigError, match=r"GPU address 3 is not among CUDA_VISIBLE_DEVICES='0,1'"):
        _pick(device_count=2, visible_devices="0,1", task_gpu_addresses=["3"])
    with pytest.raises(ConfigError, match=r"maps to device 5.*only 2"):
        _pick(device_count=2, task_gpu_addresses=["5"])


def test_driver_check_local_without_gpu(monkeypatch):
    monkeypatch.setattr("hora.estimators.devices._cuda_count", lambda: 0)
    with pytest.raises(ConfigError, match=rf"host {socket.gethostname()} .*sees no CUDA device"):
        check_gpus_before_launch(True, "local", 1)
    check_gpus_before_launch(False, "local", 1)  # use_gpu=False: nothing checked


def test_driver_check_local_more_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr("hora.estimators.devices._cuda_count", lambda: 1)
    monkeypatch.delenv("HORA_GPU_SHARING", raising=False)
    with pytest.raises(ConfigError, match=r"num_proc=2 .*1 CUDA device.*ranks 1\.\.1"):
        check_gpus_before_launch(True, "local", 2)
    check_gpus_before_launch(True, "local", 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_fit_use_gpu_without_gpu_fails_on_driver(tmp_path):
    from hora.dask import TorchEstimator
    from hora.store import Store

    store = Store.create(str(tmp_path))
    net = torch.nn.Linear(2, 1)
    df = pd.DataFrame({"x": [[0.0, 1.0]] * 8, "y": [0.0] * 8})
    est = TorchEstimator(num_proc=1, store=store, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                         loss=torch.nn.MSELoss(), feature_cols=["x"], label_cols=["y"], use_gpu=True)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        est.fit(df)
    assert not store.exists(store.layout.runs_dir()), "workers ran"


def test_dask_check_names_worker_without_gpu(dask_client):
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU error")
    with pytest.raises(ConfigError, match=r"Dask worker\(s\) tcp://.* see no CUDA device"):
        check_gpus_before_launch(True, "dask", 1, client=dask_client)
