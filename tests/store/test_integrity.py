"""Checksums of committed files: a changed or truncated Parquet file or checkpoint is named in a DataError,
a fit resumes from the newest checkpoint that verifies, `hora store verify` reports the damage, and FSDP's
distributed checkpoint goes through the Store's retries (an S3 store failing 30 % of requests). Real ranks
on local processes, the file:// store and the S3-protocol server (behind a fault proxy)."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pandas as pd
import pytest
import torch

from hora.cli import main as hora_cli
from hora.errors import DataError
from hora.estimators.callbacks import Callback
from hora.store import Store, make_reader, materialize

pytestmark = pytest.mark.timeout(300)


def _frame(n: int = 256) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return pd.DataFrame({"features": list(x), "y": (x[:, 0] > 0).astype("float64")})


class Tag(Callback):
    """Writes ``fit`` into the logs of every epoch this fit trains (the history tells which fit trained it)."""

    def __init__(self, fit: float) -> None:
        self.fit = fit

    def on_epoch_end(self, ctx, epoch, logs):
        logs["fit"] = self.fit


def _est(store, **kw):
    from hora.dask import TorchEstimator

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    args = dict(num_proc=2, backend="local", store=store, model=net,
                optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                loss=torch.nn.CrossEntropyLoss(), feature_cols=["features"], label_cols=["y"], batch_size=32,
                epochs=2, verbose=0)
    args.update(kw)
    return TorchEstimator(**args)


def _damage_middle(store: Store, path: str) -> None:
    """64 bytes in the middle of a committed file changed (its size kept)."""
    data = bytearray(store.read_bytes(path))
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(255 - b for b in data[mid:mid + 64])
    store.write_bytes(path, bytes(data))


def _verify(url: str, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = hora_cli(["store", "verify", url])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_changed_or_truncated_parquet_file_is_a_data_error_naming_it_and_verify_reports_it(kind, request, tmp_path,
                                                                                          capsys):
    from tests.store.conftest import _make_store

    store = _make_store(kind, request, tmp_path)
    if kind == "s3":  # `hora store verify s3://...` finds the server as boto does (its endpoint variable)
        request.getfixturevalue("monkeypatch").setenv("AWS_ENDPOINT_URL", request.getfixturevalue("s3_endpoint"))
    df = pd.DataFrame({"x": np.arange(8_000, dtype=np.float64), "y": (np.arange(8_000) % 3).astype(np.float64)})
    info = materialize(df, store, ["x"], ["y"], num_proc=2, rows_per_row_group=1000)
    assert all(f.checksum and f.checksum.startswith("xxh3-64:") and f.size for f in info.split_files("train"))
    rc, out = _verify(store.url, capsys)
    assert rc == 0 and "1 dataset(s)" in out and "0 damaged" in out, out
    changed, truncated = info.train_files[0], info.train_files[1]
    _damage_middle(store, changed)
    with pytest.raises(DataError, match=rf"{changed.rsplit('/', 1)[-1]} of dataset {info.fingerprint} is damaged"):
        for batch in make_reader(store, info, "train", rank=0, size=1, batch_size=500, shuffle=False):
            pass
    if kind == "file":  # reader_pool_type='process': the pool's processes check each file as the thread does
        from hora.store.process_reader import ProcessPool

        pool = ProcessPool(1, "spawn")
        try:
            reader = make_reader(store, info, "train", rank=0, size=1, batch_size=500, shuffle=False)
            reader.read_pool = pool
            with pytest.raises(DataError, match=rf"{changed.rsplit('/', 1)[-1]} of dataset .* is damaged"):
                for batch in reader:
                    pass
        finally:
            pool.close()
    store.write_bytes(truncated, store.read_bytes(truncated)[:-100])
    with pytest.raises(DataError, match=rf"{truncated.rsplit('/', 1)[-1]} of dataset .* is damaged: \d+ bytes where"):
        for batch in make_reader(store, info, "train", rank=1, size=2, batch_size=500, shuffle=False):
            pass
    rc, out = _verify(store.url, capsys)
    assert rc == 1 and "2 damaged" in out, out
    damaged = [line for line in out.splitlines() if line.startswith("DAMAGED")]
    named = sorted(line.split()[1].rstrip(":") for line in damaged)
    assert named == sorted(store.url_for(p) for p in (changed, truncated))


def test_fit_resumes_from_the_last_checkpoint_that_verifies_and_a_changed_shard_fails_the_refit(tmp_path, capsys):
    store = Store.create(f"file://{tmp_path}/store")
    df = _frame()
    first = _est(store, run_id="r1", callbacks=[Tag(1.0)]).fit(df)
    assert [h["fit"] for h in first.history_] == [1.0, 1.0]
    rc, out = _verify(store.url, capsys)
    assert rc == 0 and "0 damaged" in out and "0 without a recorded checksum" in out, out
    # the newest checkpoint truncated: the run resumes from the one before (epoch 0), and trains epochs 1 and 2
    newest = store.layout.checkpoint_path("r1", 1)
    store.write_bytes(newest, store.read_bytes(newest)[:-10])
    rc, out = _verify(store.url, capsys)
    assert rc == 1 and f"DAMAGED {store.url_for(newest)}" in out, out
    resumed = _est(store, run_id="r1", epochs=3, callbacks=[Tag(2.0)]).fit(df)
    assert [h["fit"] for h in resumed.history_] == [1.0, 2.0, 2.0]
    # a committed shard with 64 bytes changed: the same frame fitted again into the store names the file
    shard = sorted(p for p in _files(store) if "/train/" in p)[0]
    _damage_middle(store, shard)
    with pytest.raises(DataError, match=rf"{shard.rsplit('/', 1)[-1]} of dataset .* is damaged"):
        _est(store, run_id="r2").fit(df)


def _files(store: Store) -> list[str]:
    out = []
    for fp_dir in store.listdir(store.layout.datasets_dir()):
        for split in ("train", "val"):
            out += store.listdir(f"{fp_dir}/{split}")
    return out


@pytest.mark.timeout(400)
def test_an_fsdp_checkpoint_completes_on_an_s3_store_failing_30_percent_of_requests(s3_endpoint, monkeypatch, capsys):
    from hora.store import retry
    from benchmarks._common.s3_faults import FaultyProxy

    monkeypatch.setenv("HORA_STORE_RETRY_S", "60")
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.005)
    monkeypatch.setattr(retry, "BACKOFF_CAP_S", 0.05)
    with FaultyProxy(s3_endpoint, fail=0.30, reset=0.0, seed=3) as proxy:
        # the options a user writes: no retry settings of s3fs's or botocore's (the Store sets them to one attempt)
        options = {"key": "testing", "secret": "testing", "anon": False,
                   "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}}
        store = Store.create(f"s3://hora-tests/fsdp-{uuid.uuid4().hex[:8]}", **options)
        model = _est(store, strategy="fsdp", run_id="f1", epochs=1).fit(_frame())
        assert len(model.history_) == 1 and proxy.counts["failed"] > 10, proxy.counts
        folders = [e for e in store.listdir(store.layout.checkpoint_dir("f1")) if "/dcp-" in e]
        assert folders
        record = json.loads(store.read_bytes(f"{folders[-1]}/.hora-checksums.json"))["files"]
        assert sorted(record) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, out = _verify(store.url, capsys)
        assert rc == 0 and "0 damaged" in out, out
        # a changed shard of the distributed checkpoint: the resumed fit names it
        _damage_middle(store, f"{folders[-1]}/__1_0.distcp")
        with pytest.raises(DataError, match=r"__1_0.distcp of run f1 is damaged"):
            _est(store, strategy="fsdp", run_id="f1", epochs=2).fit(_frame())


def test_a_store_written_before_checksums_keeps_loading_unverified_said_once(tmp_path, monkeypatch, caplog, capsys):
    import logging

    from hora.store import integrity, writer

    monkeypatch.setattr(integrity, "_unverified_said", set())
    store = Store.create(f"file://{tmp_path}/store")
    monkeypatch.setattr(writer, "CHECKSUMS", False)  # files as hora wrote them before it recorded checksums
    df = pd.DataFrame({"x": np.arange(2_000, dtype=np.float64), "y": np.zeros(2_000)})
    info = materialize(df, store, ["x"], ["y"], num_proc=2)
    assert all(f.checksum is None and f.size is None for f in info.split_files("train"))
    store.write_bytes(store.layout.checkpoint_path("old", 0), b"checkpoint bytes")  # no record beside it
    with caplog.at_level(logging.INFO, logger="hora.store.integrity"):
        rows = sum(len(b["x"]) for r in range(2)
                   for b in make_reader(store, info, "train", rank=r, size=2, batch_size=100, shuffle=False))
        assert store.latest_checkpoint("old") == (0, b"checkpoint bytes")
    assert rows == 2_000
    said = [r.getMessage() for r in caplog.records if "no recorded checksum" in r.getMessage()]
    assert len(said) == 2 and said[0].startswith("Parquet file") and said[1].startswith("checkpoint"), said
    rc, out = _verify(store.url, capsys)
    assert rc == 0 and "0 file(s) verified, 3 without a recorded checksum, 0 damaged" in out, out


@pytest.mark.timeout(30)
def test_records_of_either_algorithm_are_checked_and_an_unknown_one_is_named(tmp_path):
    """New records are XXH3's; a CRC-32 record an earlier version wrote is still checked, byte for byte."""
    import zlib

    from hora.store import integrity

    data = bytes(range(256)) * 1000
    new = integrity.checksum_bytes(data)
    assert new.startswith("xxh3-64:") and len(new) == len("xxh3-64:") + 16
    old = f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"
    for recorded in (new, old):
        integrity.check_bytes(data, recorded, len(data), "file x")
        with pytest.raises(DataError, match="file x is damaged: its bytes have checksum"):
            integrity.check_bytes(data[:-1] + b"\x01", recorded, len(data), "file x")
    store = Store.create(str(tmp_path))
    store.write_bytes("ckpt/a.bin", data)
    integrity.verify_file(store, "ckpt/a.bin", old, len(data), "file a")
    with pytest.raises(DataError, match="unknown algorithm 'md4'"):
        integrity.check_bytes(data, "md4:00", len(data), "file x")
    # what a HashingFile writes is what it hashed
    with integrity.HashingFile(open(tmp_path / "h.bin", "wb")) as fh:
        fh.write(data[:1000])
        fh.write(memoryview(data)[1000:])
    assert fh.checksum == new and fh.size == len(data) == (tmp_path / "h.bin").stat().st_size
