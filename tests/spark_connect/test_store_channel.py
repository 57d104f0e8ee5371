"""The driver service through the Store: ranks on a Spark Connect server's executors that cannot reach
the client (simulated by advertising an address they cannot connect to) report through the run's Store,
and the client shows the same output, progress bar, failures and run logs."""

from __future__ import annotations

import logging
import os
import time

import pytest

import hora.runners as hr
from hora.errors import ConfigError, StoreError, WorkerFailedError
from hora.runners.launchers import spark as spark_launcher
from hora.runners.driver.store_channel import StoreChannel, _open, _seal
from hora.store import Store
from tests.runners.helpers import assert_no_workers_left

UNREACHABLE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no executor can connect to it


def _report_and_print():
    import numpy as np

    import hora.native as hn

    for step in range(1, 6):
        hr.report(epoch=0, epochs=1, step=step, total=5, loss=1.0 / step)
        print(f"rank {hn.rank()} step {step}", flush=True)
        time.sleep(0.2)
    return float(hn.allreduce(np.array([1.0]), op=hn.Sum, name="channel.sum")[0])


def _fail_rank1():
    import hora.native as hn

    if hn.rank() == 1:
        raise ValueError("rank 1 fails behind a firewall")
    time.sleep(120)


@pytest.fixture()
def unreachable_client(monkeypatch):
    """The client advertises an address no executor reaches (as a laptop outside the cluster)."""
    monkeypatch.setenv("HORA_ADVERTISE_ADDR", UNREACHABLE)
    monkeypatch.setattr(spark_launcher, "_reach_cache", {})


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_unreachable_client_gets_output_progress_and_failures_through_the_store(
        connect_spark, unreachable_client, tmp_path, capfd, caplog):
    store = Store.create(str(tmp_path / "store"))
    caplog.set_level(logging.INFO, logger="hora.runners.launchers.spark")
    results = hr.run(_report_and_print, num_proc=2, backend="spark", spark=connect_spark, store=store,
                     run_id="channel-ok", verbose=1)
    assert results == [2.0, 2.0]
    assert any("cannot reach this client's driver service on 192.0.2.1" in r.message
               and "report through the store" in r.message for r in caplog.records)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:rank {rank} step 5" in out
    assert "epoch 0/1 step 5/5: loss=0.2" in err  # rank 0's progress (one line off a terminal), its last metrics
    logged = store.read_bytes(store.layout.logs_dir("channel-ok") + "/rank.1.log").decode()
    assert "<stdout>:rank 1 step 5" in logged
    assert not store.exists(store.layout.channel_dir("channel-ok"))  # the channel's files are gone
    assert_no_workers_left("channel-ok")

    # a failing rank: its own error and traceback reach the client; the other rank is stopped
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_fail_rank1, num_proc=2, backend="spark", spark=connect_spark, store=store, run_id="channel-fail",
               verbose=0, start_timeout=120)
    assert time.monotonic() - t0 < 100  # not the 120 s rank 0 sleeps
    assert info.value.rank == 1
    assert "rank 1 fails behind a firewall" in str(info.value) and "_fail_rank1" in info.value.remote_traceback
    assert_no_workers_left("channel-fail")

    # no store to report through: a clear error before anything trains
    with pytest.raises(ConfigError, match=r"cannot reach this client's driver service on 192\.0\.2\.1 .*pass store="):
        hr.run(_report_and_print, num_proc=2, backend="spark", spark=connect_spark, run_id="channel-nostore")


@pytest.mark.timeout(30)
def test_channel_files_are_signed_and_the_setting_is_checked(tmp_path, spark, monkeypatch):
    secret = os.urandom(32)
    sealed = _seal(secret, {"runner/done/0": b"1"})
    assert _open(secret, sealed, "state") == {"runner/done/0": b"1"}
    with pytest.raises(StoreError, match="not signed by this run's secret"):
        _open(os.urandom(32), sealed, "state")  # another job's (or anyone's) file is never unpickled
    with pytest.raises(StoreError, match="not signed"):
        _open(secret, sealed[:-1] + b"x", "state")
    channel = StoreChannel(Store.create(str(tmp_path)), "run-1")
    assert channel.folder.endswith("/runs/run-1/channel") and channel.log_name(3).endswith("channel/log-000000003")
    with pytest.raises(ConfigError, match="channel must be one of auto, direct, store"):
        hr.SparkLauncher(spark, channel="pigeon")
    monkeypatch.setenv("HORA_DRIVER_CHANNEL", "smoke")
    with pytest.raises(ConfigError, match="HORA_DRIVER_CHANNEL='smoke' is invalid: it must be one of auto, direct, store"):
        hr.SparkLauncher(spark)
    monkeypatch.setenv("HORA_DRIVER_CHANNEL", "store")
    assert hr.SparkLauncher(spark).channel == "store"
