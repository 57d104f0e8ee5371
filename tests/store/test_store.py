"""The Store conformance suite: every test runs over file://, memory:// and s3:// (moto)."""

import multiprocessing as mp
import pickle
import socket

import pytest

from hora.errors import ConfigError, StoreError
from hora.store import Store

pytestmark = pytest.mark.timeout(60)


def test_bytes_round_trip_and_overwrite(any_store):
    path = any_store.layout.history_path("run1")
    assert not any_store.exists(path)
    any_store.write_bytes(path, b"one")
    assert any_store.exists(path)
    assert any_store.read_bytes(path) == b"one"
    any_store.write_bytes(path, b"two, longer")
    assert any_store.read_bytes(path) == b"two, longer"
    assert any_store.size(path) == len(b"two, longer")
    # no temporary files are left next to the target
    assert any_store.listdir(any_store.layout.run_dir("run1")) == [path]


def test_relative_and_url_paths_resolve_below_the_root(any_store):
    any_store.write_bytes("a/b.txt", b"x")
    full = any_store.url_for("a/b.txt")
    assert full.startswith(any_store.url)
    assert any_store.read_bytes(full) == b"x"
    assert any_store.read_bytes(any_store.layout.root + "/a/b.txt") == b"x"


def test_paths_cannot_escape_the_root(any_store):
    with pytest.raises(StoreError, match="escapes|outside"):
        any_store.read_bytes("../elsewhere")
    with pytest.raises(ConfigError):
        any_store.read_bytes("")


def test_read_missing_names_the_path(any_store):
    with pytest.raises(StoreError, match="nothing-here"):
        any_store.read_bytes("nothing-here")


def test_listdir_rm_and_mv(any_store):
    d = any_store.layout.dataset_dir("fp")
    any_store.write_bytes(d + "/train/p0", b"0")
    any_store.write_bytes(d + "/train/p1", b"1")
    any_store.write_bytes(d + "/_metadata.json", b"{}")
    assert any_store.listdir(d + "/train") == [d + "/train/p0", d + "/train/p1"]
    assert any_store.listdir(d + "/missing") == []
    any_store.mv(d + "/train/p1", d + "/val/p1")
    assert any_store.read_bytes(d + "/val/p1") == b"1"
    assert not any_store.exists(d + "/train/p1")
    any_store.rm(d + "/train/p0")
    assert not any_store.exists(d + "/train/p0")
    any_store.rm(d, recursive=True)
    assert not any_store.exists(d + "/_metadata.json")
    any_store.rm(d, recursive=True)  # missing_ok by default
    with pytest.raises(StoreError):
        any_store.rm(d, missing_ok=False)


def test_open_and_json(any_store):
    any_store.makedirs("logs")
    with any_store.open("logs/events.txt", "wb") as fh:
        fh.write(b"line\n")
    with any_store.open("logs/events.txt", "rb") as fh:
        assert fh.read() == b"line\n"
    any_store.write_json("h.json", {"loss": [1.5, 0.5]})
    assert any_store.read_json("h.json") == {"loss": [1.5, 0.5]}
    any_store.write_bytes("bad.json", b"{not json")
    with pytest.raises(StoreError, match="bad.json"):
        any_store.read_json("bad.json")


def test_checkpoints(any_store):
    assert any_store.latest_checkpoint("r") is None
    any_store.save_checkpoint("r", 2, b"two")
    any_store.save_checkpoint("r", 10, b"ten")
    any_store.save_checkpoint("r", 9, b"nine")
    assert any_store.list_checkpoints("r") == [2, 9, 10]
    assert any_store.latest_checkpoint("r") == (10, b"ten")
    any_store.save_checkpoint("r", 10, b"ten again")
    assert any_store.latest_checkpoint("r") == (10, b"ten again")


def test_pickles_without_its_filesystem(any_store):
    any_store.write_bytes("k", b"v")
    clone = pickle.loads(pickle.dumps(any_store))
    assert clone == any_store and clone.url == any_store.url
    assert clone._fs is None
    assert clone.read_bytes("k") == b"v"  # same process: even memory:// sees it


def _child_read(store, path, q):
    q.put(store.read_bytes(path))


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_usable_in_a_spawned_process(kind, request, tmp_path):
    from tests.store.conftest import _make_store

    store = _make_store(kind, request, tmp_path)
    store.write_bytes("shared", b"from parent")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(store, "shared", q))
    p.start()
    try:
        assert q.get(timeout=50) == b"from parent"
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()


def test_unknown_scheme():
    with pytest.raises(StoreError, match="unknown store URL scheme 'ftpx'"):
        Store.create("ftpx://host/path")


def test_missing_optional_package_is_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(StoreError, match="pip install gcsfs"):
        Store.create("gs://bucket/prefix")


def test_unwritable_local_path(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="not writable"):
        Store.create(str(blocker / "store"))


def test_bad_url_types():
    with pytest.raises(ConfigError):
        Store.create("")
    with pytest.raises(ConfigError):
        Store.create(42)
    with pytest.raises(StoreError, match="no bucket"):
        Store.create("s3://")


def test_missing_bucket(s3_options):
    with pytest.raises(StoreError, match="not writable"):
        Store.create("s3://no-such-bucket-hora/x", **s3_options)


def test_unreachable_s3_endpoint(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HORA_STORE_TIMEOUT", "5")
    with pytest.raises(StoreError, match="did not answer|not writable"):
        Store.create(
            "s3://bucket/x",
            key="k",
            secret="s",
            client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"},
            config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1},
        )


def test_bare_path_and_check_writable_skip(tmp_path):
    s = Store.create(str(tmp_path / "bare"), check_writable=False)
    assert s.protocol == "file" and s.url == f"file://{tmp_path}/bare"
    s.check_writable(timeout=10)
    assert s.is_local


def test_the_data_path_never_imports_an_ml_framework(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np, pandas as pd
        from hora.store import Store, materialize, make_reader, torch_batches, make_tf_dataset
        store = Store.create({str(tmp_path / "s")!r})
        info = materialize(pd.DataFrame({{"x": np.arange(10.0), "y": np.arange(10)}}), store, ["x"], ["y"])
        assert sum(len(b["x"]) for b in make_reader(store, info, batch_size=3)) == 10
        loaded = [m for m in ("torch", "tensorflow", "keras", "jax") if m in sys.modules]
        print(loaded)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("url", ["dbfs:/hora/x", "hdfs://127.0.0.1:1/hora"])
def test_schemes_without_their_service_fail_clearly(url, monkeypatch):
    import os

    if url.startswith("dbfs") and os.path.isdir("/dbfs"):
        pytest.skip("a DBFS mount exists here")
    monkeypatch.setenv("HORA_STORE_TIMEOUT", "20")
    with pytest.raises(StoreError, match=r"store (dbfs|hdfs)"):
        Store.create(url)
