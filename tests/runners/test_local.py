"""hora.runners.run on local processes: real worker processes over loopback."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import hora.runners as hr
from hora.errors import ConfigError, RankError, RankKilledError, RanksNotStartedError, RendezvousError, WorkerFailedError
from hora.runners import api as base
from hora.runners.api import RunTimeoutError

from .helpers import assert_no_workers_left


def _env_fn(x):
    keys = ["HORA_RANK", "HORA_SIZE", "HORA_LOCAL_RANK", "HORA_LOCAL_SIZE", "HORA_CROSS_RANK", "HORA_CROSS_SIZE",
            "HORA_HOSTNAME", "HORA_JOB_ID", "HORA_CYCLE_TIME", "GLOO_SOCKET_IFNAME"]
    return x * int(os.environ["HORA_RANK"]), {k: os.environ.get(k) for k in keys}


@pytest.mark.timeout(120)
def test_results_in_rank_order_with_contract_env():
    results = hr.run(_env_fn, args=(10,), num_proc=3, env={"HORA_CYCLE_TIME": "2"}, run_id="env-test", verbose=0)
    assert [r[0] for r in results] == [0, 10, 20]
    for rank, (_, env) in enumerate(results):
        assert env["HORA_RANK"] == str(rank)
        assert env["HORA_SIZE"] == "3"
        assert env["HORA_LOCAL_RANK"] == str(rank) and env["HORA_LOCAL_SIZE"] == "3"
        assert env["HORA_CROSS_RANK"] == "0" and env["HORA_CROSS_SIZE"] == "1"
        assert env["HORA_HOSTNAME"] == "127.0.0.1"
        assert env["HORA_JOB_ID"] == "env-test"
        assert env["HORA_CYCLE_TIME"] == "2"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"


def _allreduce_fn(scale):
    import numpy as np

    import hora.native as hn

    assert hn.is_initialized()
    out = hn.allreduce(np.array([float(hn.rank() + 1)] * 4), op=hn.Sum, name="runner.sum")
    return hn.rank(), hn.size(), (out * scale).tolist()


@pytest.mark.timeout(180)
def test_native_is_initialised_inside_fn():
    results = hr.run(_allreduce_fn, kwargs={"scale": 2.0}, num_proc=2, verbose=0)
    assert results == [(0, 2, [6.0] * 4), (1, 2, [6.0] * 4)]


def _late_init_without_collectives():
    import time

    import hora.native as hn

    if hn.rank() == 0:
        time.sleep(1.0)  # the other rank's function has long returned (it returns at once)
    hn.init()  # Horovod's functions call init themselves: a no-op here
    return hn.rank()


@pytest.mark.timeout(120)
def test_a_rank_late_to_its_own_init_finds_its_peers_still_there(monkeypatch):
    # a peer whose function returned early must not shut its engine down first: the late
    # rank's init would find it gone and wait for a job that never re-forms
    monkeypatch.setenv("HORA_START_TIMEOUT", "20")
    assert hr.run(_late_init_without_collectives, num_proc=2, verbose=0) == [0, 1]


def _fail_rank1():
    if os.environ["HORA_RANK"] == "1":
        raise ValueError("boom-from-rank-1 with a distinctive message")
    time.sleep(120)
    return "never"


@pytest.mark.timeout(120)
def test_exception_carries_remote_traceback_and_no_orphans():
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_fail_rank1, num_proc=3, run_id="fail-r1", verbose=0)
    err = info.value
    assert type(err) is RankError  # the kind of the root cause, as a class
    assert err.rank == 1
    assert err.host == "127.0.0.1"
    assert "boom-from-rank-1 with a distinctive message" in err.remote_traceback
    assert "_fail_rank1" in err.remote_traceback and "Traceback" in err.remote_traceback
    assert "ValueError" in str(err)
    assert_no_workers_left("fail-r1")


def _first_failure():
    import hora.native as hn

    if hn.rank() == 1:
        raise KeyError("the first failure")
    time.sleep(1.0)
    raise RuntimeError("a secondary failure that happens later")


@pytest.mark.timeout(180)
def test_the_first_failure_is_reported():
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_first_failure, num_proc=2, verbose=0)
    assert info.value.rank == 1
    assert "the first failure" in info.value.remote_traceback


def _hang_rank0():
    if os.environ["HORA_RANK"] == "0":
        time.sleep(300)
    return os.environ["HORA_RANK"]


@pytest.mark.timeout(120)
def test_hanging_rank_leads_to_a_timeout_error(monkeypatch):
    monkeypatch.setenv("HORA_FINISH_TIMEOUT", "1")
    with pytest.raises(RunTimeoutError) as info:
        hr.run(_hang_rank0, num_proc=2, run_id="hang-r0", verbose=0)
    assert info.value.rank == 0
    assert "rank(s) [0] did not finish" in str(info.value)
    assert isinstance(info.value, TimeoutError)
    assert_no_workers_left("hang-r0")


def _sleep_forever():
    time.sleep(300)


@pytest.mark.timeout(120)
def test_run_timeout_parameter():
    with pytest.raises(RunTimeoutError, match=r"timeout=1s; rank\(s\) \[0, 1\] still running"):
        hr.run(_sleep_forever, num_proc=2, run_id="timeout-param", verbose=0, timeout=1)
    assert_no_workers_left("timeout-param")


@pytest.mark.timeout(120)
def test_rank_that_never_starts_is_named(monkeypatch):
    # injected from outside the library: a sitecustomize that makes rank 1's process sleep before it starts
    hook = os.path.join(os.path.dirname(__file__), "hang_at_start")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (hook, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("HANG_AT_START_RANKS", "1")
    with pytest.raises(RendezvousError, match=r"rank\(s\) \[1\] of run never-starts never started within 4s") as info:
        # (the clock starts once the ranks are launched: rank 0, forked warm, registers in well under a second)
        hr.run(_hang_rank0, num_proc=2, run_id="never-starts", start_timeout=4, verbose=0)
    assert type(info.value) is RanksNotStartedError and info.value.retriable
    assert_no_workers_left("never-starts")


def _sigkill_self():
    if os.environ["HORA_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)


@pytest.mark.timeout(120)
def test_worker_killed_with_sigkill_fails_the_run():
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_sigkill_self, num_proc=2, run_id="sigkill", verbose=0)
    assert time.monotonic() - t0 < 60
    assert type(info.value) is RankKilledError and info.value.retriable
    assert info.value.rank == 1
    assert "SIGKILL" in str(info.value)
    assert_no_workers_left("sigkill")


def _chatty():
    import logging

    rank = os.environ["HORA_RANK"]
    print(f"hello stdout from {rank}", flush=True)
    logging.getLogger("user.code").warning("a log record from %s", rank)
    for step in range(1, 4):
        hr.report(step=step, total=3, epoch=0, loss=1.0 / step)
    return rank


@pytest.mark.timeout(120)
def test_output_prefixed_progress_and_store_logs(tmp_path, capfd):
    from hora.store import Store

    store = Store.create(f"file://{tmp_path}/store")
    assert hr.run(_chatty, num_proc=2, run_id="chatty", store=store, verbose=1) == ["0", "1"]
    out, err = capfd.readouterr()
    assert "[0]<stdout>:hello stdout from 0" in out
    assert "[1]<stdout>:hello stdout from 1" in out
    assert "[1]<stderr>:WARNING user.code: a log record from 1" in err
    assert "loss=0.3333" in err  # the progress bar shows rank 0's latest metrics
    logs = store.layout.logs_dir("chatty")
    text0 = store.read_bytes(f"{logs}/rank.0.log").decode()
    text1 = store.read_bytes(f"{logs}/rank.1.log").decode()
    assert "<stdout>:hello stdout from 0" in text0
    assert "a log record from 1" in text1


@pytest.mark.timeout(120)
def test_quiet_run_prints_nothing(capfd):
    hr.run(_chatty, num_proc=1, verbose=0)
    out, err = capfd.readouterr()
    assert "hello stdout" not in out and "loss=" not in err


def _print_env_secret():
    # a rank may see its own secret; the launcher must not print or log it
    print("rank", os.environ["HORA_RANK"], "up", flush=True)
    return len(os.environ["HORA_SECRET"])


@pytest.mark.timeout(120)
def test_secret_is_never_printed_or_logged(monkeypatch, capfd, caplog):
    secret = bytes(range(100, 132))
    monkeypatch.setattr(base, "make_secret", lambda: secret)
    caplog.set_level("DEBUG")
    assert hr.run(_print_env_secret, num_proc=2, verbose=2) == [64, 64]
    out, err = capfd.readouterr()
    text = out + err + caplog.text
    assert "rank 0 up" in out
    assert secret.hex() not in text
    assert repr(secret) not in text
    assert repr(secret)[2:-1] not in text


def test_spec_repr_hides_the_secret_and_payload():
    from hora.runners.spec import LaunchSpec

    secret = b"\x01" * 32
    spec = LaunchSpec(payload=b"PAYLOAD", fn_name="f", num_proc=2, run_id="r1", secret=secret, driver_addr="127.0.0.1:1")
    assert "PAYLOAD" not in repr(spec) and secret.hex() not in repr(spec) and str(secret) not in repr(spec)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_proc": 0}, "num_proc must be an int >= 1"),
        ({"num_proc": -2}, "num_proc must be an int >= 1"),
        ({"num_proc": 1.5}, "num_proc must be an int >= 1"),
        ({"backend": "yarn"}, "backend 'yarn' is unknown"),
        ({"run_id": "../evil"}, "run_id '../evil' is invalid"),
        ({"start_timeout": 0}, "start_timeout must be a positive number"),
        ({"timeout": -1}, "timeout must be a positive number"),
        ({"args": (threading.Lock(),)}, "cannot be pickled"),
        ({"env": {"A": 1}}, r"env\['A'\] must be a str"),
        ({"store": 42}, "store must be a hora.store.Store"),
    ],
)
def test_bad_arguments_fail_before_starting_anything(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        hr.run(_env_fn, **{"args": (1,), "num_proc": 1, "verbose": 0, **kwargs})


def test_fn_must_be_callable():
    with pytest.raises(ConfigError, match="fn must be callable"):
        hr.run("not a function", num_proc=1)


def test_spark_and_dask_backends_need_a_session_or_client():
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is None:
        with pytest.raises(ConfigError, match="needs a SparkSession"):
            hr.run(_env_fn, args=(1,), backend="spark")
    pytest.importorskip("distributed")
    from distributed import get_client

    try:
        get_client()
    except ValueError:
        with pytest.raises(ConfigError, match="needs a distributed.Client"):
            hr.run(_env_fn, args=(1,), backend="dask")


@pytest.mark.timeout(120)
def test_keyboard_interrupt_on_the_driver_stops_every_rank(tmp_path):
    from .helpers import interrupt_when_files_exist, touch_and_sleep

    interrupt_when_files_exist([str(tmp_path / "in-fn.0"), str(tmp_path / "in-fn.1")])
    with pytest.raises(KeyboardInterrupt):
        hr.run(touch_and_sleep, args=(str(tmp_path),), num_proc=2, run_id="ctrl-c", verbose=0)
    assert_no_workers_left("ctrl-c")
