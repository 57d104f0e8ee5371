"""Concurrent materializations of one dataset into one Store (file:// and s3:// on a moto server):
both fits succeed, no attempt deletes another live attempt's files, a killed writer's leftovers
are swept once its lease expires."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from hora.store import load_dataset_info, make_reader, materialize
from hora.store.layout import LEASE_PREFIX, TMP_PREFIX
from hora.store.lease import ENV_LEASE_TTL, ENV_WAIT_TIMEOUT
from .conftest import _make_store
from .faults import delay_commit, delayed_commit_code

pytestmark = pytest.mark.timeout(240)

ROWS = 600


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    return _make_store(request.param, request, tmp_path)


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"x": np.arange(ROWS, dtype=np.float64), "y": np.arange(ROWS) % 3})


def _entries(store, info) -> list[str]:
    return sorted(e.rsplit("/", 1)[-1] for e in store.listdir(info.dataset_dir))


def _assert_clean_commit(store, info) -> None:
    """Only the committed dataset is left, and its train folder holds exactly the files its metadata lists."""
    assert [e for e in _entries(store, info) if e.startswith((TMP_PREFIX, LEASE_PREFIX))] == []
    on_disk = sorted(e.rsplit("/", 1)[-1] for e in store.listdir(store.layout.train_dir(info.fingerprint)))
    assert on_disk == sorted(f.path.rsplit("/", 1)[-1] for f in info.files["train"])
    batches = list(make_reader(store, info, split="train", batch_size=100, shuffle=False, prefetch=0))
    np.testing.assert_array_equal(np.sort(np.concatenate([b["x"] for b in batches])), np.arange(ROWS, dtype=np.float64))


def _wait_for_lease(store, timeout: float = 60.0) -> str:
    """The dataset folder of the first lease that appears in the store."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ds in store.listdir(store.layout.datasets_dir()):
            if any(e.rsplit("/", 1)[-1].startswith(LEASE_PREFIX) for e in store.listdir(ds)):
                return ds
        time.sleep(0.05)
    raise AssertionError("no materialization lease appeared")


def _in_thread(fn, results: dict, key: str) -> threading.Thread:
    def _run() -> None:
        try:
            results[key] = fn()
        except BaseException as exc:  # handed to the test
            results[key] = exc

    thread = threading.Thread(target=_run, name=f"materialize-{key}")
    thread.start()
    return thread


@pytest.mark.spark
def test_a_second_fit_of_one_spark_frame_waits_for_the_first_commit_and_reuses_it(spark, store, monkeypatch):
    sdf = spark.createDataFrame(_frame()).repartition(2)
    delay_commit(monkeypatch, 2)  # the first attempt holds its staged files a while
    results: dict = {}
    first = _in_thread(lambda: materialize(sdf, store, ["x"], ["y"], num_proc=1), results, "first")
    _wait_for_lease(store)
    second = _in_thread(lambda: materialize(sdf, store, ["x"], ["y"], num_proc=1), results, "second")
    first.join(180)
    second.join(180)
    a, b = results["first"], results["second"]
    assert not isinstance(a, BaseException), a
    assert not isinstance(b, BaseException), b
    assert not a.reused and b.reused
    assert b.fingerprint == a.fingerprint and b.train_files == a.train_files
    _assert_clean_commit(store, a)


def test_attempts_that_do_not_wait_commit_their_own_without_harm(store, monkeypatch):
    # three attempts write their own copies at once (no waiting); the commits are exclusive, the first
    # one wins, the others adopt it and remove only their own staging folders
    monkeypatch.setenv(ENV_WAIT_TIMEOUT, "0")
    delay_commit(monkeypatch, 1)
    df = _frame()
    results: dict = {}
    threads = [_in_thread(lambda: materialize(df, store, ["x"], ["y"], num_proc=2), results, str(i)) for i in range(3)]
    for thread in threads:
        thread.join(180)
    infos = [results[str(i)] for i in range(3)]
    for info in infos:
        assert not isinstance(info, BaseException), info
    assert sorted(info.reused for info in infos) == [False, True, True]
    assert len({info.fingerprint for info in infos}) == 1
    winner = next(info for info in infos if not info.reused)
    assert all(info.train_files == winner.train_files for info in infos)
    assert load_dataset_info(store, winner.fingerprint).train_files == winner.train_files
    _assert_clean_commit(store, winner)


_WRITER = """
import json, sys
import numpy as np, pandas as pd
from hora.store import Store, materialize
url, options = sys.argv[1], json.loads(sys.argv[2])
df = pd.DataFrame({"x": np.arange(%d, dtype=np.float64), "y": np.arange(%d) %% 3})
info = materialize(df, Store.create(url, **options), ["x"], ["y"], num_proc=2)
print(json.dumps({"reused": info.reused, "train_files": list(info.train_files)}))
""" % (ROWS, ROWS)


def _start_writer(store, request, delay: float, **env):
    """A materialization of :func:`_frame` in another process, stopped ``delay`` seconds before its commit."""
    options = request.getfixturevalue("s3_options") if store.protocol == "s3" else {}
    return subprocess.Popen([sys.executable, "-c", delayed_commit_code(delay) + _WRITER, store.url, json.dumps(options)],
                            env=dict(os.environ, **env), stdout=subprocess.PIPE, text=True)


def _wait_for_staged_files(store, timeout: float = 120.0) -> tuple[str, list[str]]:
    """(dataset folder, staged train files) of the first attempt whose data is written, not committed."""
    dataset_dir = _wait_for_lease(store)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tmp = [e for e in store.listdir(dataset_dir) if e.rsplit("/", 1)[-1].startswith(TMP_PREFIX)]
        staged = [f for t in tmp for f in store.listdir(t + "/train")] if tmp else []
        if staged:
            return dataset_dir, staged
        time.sleep(0.1)
    raise AssertionError("the writer never staged its files")


def test_a_commit_never_deletes_a_live_attempt_s_files(store, request, monkeypatch):
    # another process has staged its files and is about to commit; this one does not wait for it
    writer = _start_writer(store, request, 5)
    try:
        _, staged = _wait_for_staged_files(store)
        monkeypatch.setenv(ENV_WAIT_TIMEOUT, "0")
        mine = materialize(_frame(), store, ["x"], ["y"], num_proc=2)
        assert not mine.reused
        assert all(store.exists(f) for f in staged)  # the live attempt's staging folder is untouched
        out, _ = writer.communicate(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(30)
    assert writer.returncode == 0
    theirs = json.loads(out.strip().splitlines()[-1])
    assert theirs == {"reused": True, "train_files": list(mine.train_files)}  # it adopted the commit made first
    _assert_clean_commit(store, mine)


def test_a_writer_killed_mid_way_is_swept(store, request):
    writer = _start_writer(store, request, 300, **{ENV_LEASE_TTL: "2"})
    try:
        dataset_dir, _ = _wait_for_staged_files(store)
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(30) == -signal.SIGKILL
        # the writer's process is gone (same machine), so its lease no longer counts: this attempt writes
        info = materialize(_frame(), store, ["x"], ["y"], num_proc=2)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(30)
    assert not info.reused and info.train_rows == ROWS
    assert info.dataset_dir.rstrip("/") == dataset_dir.rstrip("/")
    _assert_clean_commit(store, info)  # the killed writer's staging folder and lease are gone


def _plant_attempt(store, fingerprint: str, attempt: str, heartbeat_age: float, ttl: float) -> str:
    """The lease and one staged file of an attempt running on another machine; returns the staged file."""
    now = time.time()
    lease = {"attempt": attempt, "fingerprint": fingerprint, "started_at": now - heartbeat_age - 5,
             "heartbeat_at": now - heartbeat_age, "ttl": ttl, "phase": "writing", "host": "elsewhere",
             "pid": 1, "machine": "elsewhere|another-boot|pid:[1]"}
    store.write_bytes(store.layout.lease_path(fingerprint, attempt), json.dumps(lease).encode())
    staged = f"{store.layout.tmp_dir(fingerprint, attempt)}/train/part-00000-{attempt}.parquet"
    store.write_bytes(staged, b"staged by another machine")
    return staged


def test_another_machine_s_attempt_is_swept_once_its_lease_expires_and_kept_while_alive(store):
    first = materialize(_frame(), store, ["x"], ["y"], num_proc=2)
    fp = first.fingerprint
    dead = _plant_attempt(store, fp, "deadbeef0001", heartbeat_age=600, ttl=60)  # silent for 10 min
    live = _plant_attempt(store, fp, "livebeef0002", heartbeat_age=1, ttl=600)  # heartbeat 1 s ago
    again = materialize(_frame(), store, ["x"], ["y"], num_proc=2, overwrite=True)
    assert not again.reused
    left = _entries(store, again)
    assert "_tmp-deadbeef0001" not in left and "_lease-deadbeef0001.json" not in left and not store.exists(dead)
    assert "_tmp-livebeef0002" in left and "_lease-livebeef0002.json" in left and store.exists(live)
    store.rm(store.layout.tmp_dir(fp, "livebeef0002"), recursive=True)
    store.rm(store.layout.lease_path(fp, "livebeef0002"))
    _assert_clean_commit(store, again)
