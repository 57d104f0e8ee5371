"""The Store's retry policy: classification, backoff within the budget, resumed reads, and a
Store that completes its work through injected failures on file:// and on s3:// (moto behind
a proxy that fails a share of the requests)."""

from __future__ import annotations

import errno
import io
import random
import socket
import time
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hora.errors import StoreError
from hora.store import Store, make_reader, materialize, retry

pytestmark = pytest.mark.timeout(120)


class _ClientError(Exception):
    """Shaped like botocore's ClientError: the service code in ``response``."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ServerDisconnectedError(Exception):
    """Named as aiohttp's."""


@pytest.mark.parametrize("exc, kind", [
    (OSError(errno.EBUSY, "Service Unavailable"), retry.TRANSIENT),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), retry.TRANSIENT),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), retry.TRANSIENT),
    (TimeoutError("read timed out"), retry.TRANSIENT),
    (_ClientError("SlowDown", 503), retry.TRANSIENT),
    (_ClientError("InternalError", 500), retry.TRANSIENT),
    (_ClientError("ThrottlingException", 400), retry.TRANSIENT),
    (ServerDisconnectedError("Server disconnected"), retry.TRANSIENT),
    (OSError("upstream said: 503 Service Unavailable"), retry.TRANSIENT),
    (FileNotFoundError(errno.ENOENT, "no such file"), retry.PERMANENT),
    (PermissionError(errno.EACCES, "denied"), retry.PERMANENT),
    (OSError(errno.ENOSPC, "No space left on device"), retry.PERMANENT),
    (_ClientError("AccessDenied", 403), retry.PERMANENT),
    (_ClientError("NoSuchBucket", 404), retry.PERMANENT),
    (ValueError("bad URL"), retry.PERMANENT),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), retry.PERMANENT),
    (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), retry.TRANSIENT),
    (TypeError("a bug"), retry.PERMANENT),
])
def test_classify(exc, kind):
    assert retry.classify(exc) == kind


def test_classify_looks_at_the_cause():
    try:
        try:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        except ConnectionResetError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert retry.classify(outer) == retry.TRANSIENT


class _Flaky:
    """A callable that fails ``failures`` times with ``exc`` and then answers ``value``."""

    def __init__(self, failures: int, exc: BaseException, value: object = "ok") -> None:
        self.failures, self.exc, self.value, self.calls = failures, exc, value, 0

    def __call__(self) -> object:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return self.value


def test_call_retries_transient_failures_with_full_jitter_backoff():
    retry.reset_counts()
    slept: list[float] = []
    fn = _Flaky(5, OSError(errno.EBUSY, "Service Unavailable"))
    assert retry.call("read", "s3://b/k", fn, budget=60.0, sleep=slept.append) == "ok"
    assert fn.calls == 6
    assert len(slept) == 5
    # full jitter: every delay within [0, min(cap, base * 2**attempt)]
    for attempt, delay in enumerate(slept, start=1):
        assert 0.0 <= delay <= min(retry.BACKOFF_CAP_S, retry.BACKOFF_BASE_S * 2 ** attempt)
    assert retry.retry_counts() == {"EBUSY": 5}


def test_call_raises_a_permanent_failure_at_once():
    fn = _Flaky(3, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError, match="No space"):
        retry.call("write", "file:///x", fn, budget=60.0, sleep=lambda s: None)
    assert fn.calls == 1


def test_call_gives_up_when_the_budget_is_spent(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(retry.time, "monotonic", lambda: clock[0])

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    fn = _Flaky(10**9, ConnectionResetError(errno.ECONNRESET, "reset"))
    with pytest.raises(ConnectionResetError) as info:
        retry.call("open", "s3://b/k", fn, budget=3.0, sleep=sleep)
    assert clock[0] <= 3.0
    assert fn.calls > 3
    assert any("gave up after" in note and "HORA_STORE_RETRY_S=3" in note for note in info.value.__notes__)


def test_budget_zero_means_no_retry(monkeypatch):
    monkeypatch.setenv("HORA_STORE_RETRY_S", "0")
    fn = _Flaky(1, OSError(errno.EBUSY, "busy"))
    with pytest.raises(OSError):
        retry.call("read", "s3://b/k", fn, sleep=lambda s: None)
    assert fn.calls == 1


class _BreakingFile(io.BytesIO):
    """A file over ``data`` whose reads, by a seeded draw, fail with a reset or return fewer bytes."""

    def __init__(self, data: bytes, rng: random.Random, opened: list[int]) -> None:
        super().__init__(data)
        self.rng = rng
        opened.append(1)

    def read(self, n: int = -1) -> bytes:
        draw = self.rng.random()
        if draw < 0.3:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        if draw < 0.5 and n and n > 1:
            n = self.rng.randrange(1, n)  # a short read, as sockets give
        return super().read(n)


def _resumable(data: bytes, seed: int) -> tuple[retry.ResumableReader, list[int]]:
    rng, opened = random.Random(seed), []
    return retry.ResumableReader(lambda: _BreakingFile(data, rng, opened), len(data), "read", "mem://f"), opened


def test_resumable_reader_returns_exact_bytes_through_resets_and_short_reads(monkeypatch):
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    data = np.random.default_rng(3).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    reader, opened = _resumable(data, seed=7)
    rng = random.Random(11)
    out, pos = [], 0
    while pos < len(data):
        if rng.random() < 0.2:  # seek around, as Parquet readers do
            pos = rng.randrange(0, len(data))
            reader.seek(pos)
            out = [data[:pos]]
        n = rng.randrange(1, 40_000)
        chunk = reader.read(n)
        assert len(chunk) == min(n, len(data) - pos), "a read came back short"
        out.append(chunk)
        pos += len(chunk)
    assert b"".join(out) == data
    assert reader.read(10) == b""
    assert len(opened) > 1, "the test injected no reset"
    reader.close()


def test_resumable_reader_feeds_pyarrow(monkeypatch):
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    table = pa.table({"x": np.arange(50_000, dtype=np.float32), "y": np.arange(50_000) % 7})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=2_000)
    reopened = 0
    for seed in range(4):
        reader, opened = _resumable(sink.getvalue(), seed=seed)
        pf = pq.ParquetFile(reader)
        got = pa.concat_tables([pf.read_row_group(g) for g in range(pf.num_row_groups)])
        assert got.equals(table)
        reopened += len(opened) - 1
    assert reopened > 0, "the test injected no reset" 


class _FlakyFS:
    """Delegates to a real filesystem; each call of the listed methods fails first with ``exc``
    ``every`` times out of ``every + 1`` (deterministic: fail, fail, ..., pass)."""

    METHODS = ("cat_file", "pipe_file", "ls", "exists", "isdir", "info", "size", "makedirs", "rm", "mv")

    def __init__(self, fs, exc_factory, every: int = 1) -> None:
        self._fs, self._exc, self._every, self.injected = fs, exc_factory, every, 0
        self._n: dict[str, int] = {}

    def __getattr__(self, name: str):
        target = getattr(self._fs, name)
        if name not in self.METHODS:
            return target

        def flaky(*args, **kwargs):
            n = self._n.get(name, 0)
            self._n[name] = n + 1
            if n % (self._every + 1) != self._every:
                self.injected += 1
                raise self._exc()
            return target(*args, **kwargs)

        return flaky


def test_file_store_completes_through_injected_transient_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    retry.reset_counts()
    store = Store.create(f"file://{tmp_path}/store")
    flaky = _FlakyFS(store.fs, lambda: OSError(errno.EBUSY, "Device or resource busy"), every=2)
    store._fs = flaky
    store.write_json("runs/r1/history.json", {"loss": [1.0, 0.5]})
    assert store.exists("runs/r1/history.json")
    assert store.read_json("runs/r1/history.json") == {"loss": [1.0, 0.5]}
    assert [p.rsplit("/", 1)[-1] for p in store.listdir("runs/r1")] == ["history.json"]
    store.rm("runs/r1", recursive=True)
    assert not store.exists("runs/r1")
    assert flaky.injected >= 6
    assert retry.retry_counts().get("EBUSY", 0) == flaky.injected


def test_a_permanent_error_fails_at_once_naming_the_operation_and_url(tmp_path):
    store = Store.create(f"file://{tmp_path}/store")
    flaky = _FlakyFS(store.fs, lambda: OSError(errno.ENOSPC, "No space left on device"), every=10**6)
    store._fs = flaky
    with pytest.raises(StoreError, match=r"read file://.*/store/a\.bin failed: OSError: .*No space"):
        store.read_bytes("a.bin")
    assert flaky.injected == 1


def test_transient_errors_past_the_budget_name_the_store_and_the_operation(tmp_path, monkeypatch):
    monkeypatch.setenv("HORA_STORE_RETRY_S", "0.2")
    store = Store.create(f"file://{tmp_path}/store")
    store._fs = _FlakyFS(store.fs, lambda: OSError(errno.EBUSY, "Device or resource busy"), every=10**6)
    with pytest.raises(StoreError, match=r"read file://.*/store/a\.bin failed: .*gave up after \d+ attempt"):
        store.read_bytes("a.bin")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [4, 11])
def test_s3_store_materializes_and_reads_through_a_failing_proxy(s3_endpoint, monkeypatch, seed):
    """30 % of requests answered 503/500 and 5 % reset: materialize, then every rank's reader
    gets every row, with s3fs's and botocore's own retries turned off (hora's policy alone)."""
    import s3fs

    from benchmarks._common.s3_faults import FaultyProxy

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retries off: hora's policy alone
    monkeypatch.setattr(s3fs.core.S3File, "retries", 1)
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.005)
    monkeypatch.setattr(retry, "BACKOFF_CAP_S", 0.05)
    retry.reset_counts()
    n = 4_000
    df = pd.DataFrame({"x": np.arange(n, dtype=np.float64), "y": (np.arange(n) % 3).astype(np.float64)})
    with FaultyProxy(s3_endpoint, fail=0.30, reset=0.05, seed=seed) as proxy:
        options = {
            "key": "testing", "secret": "testing", "anon": False,
            "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
            "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"},
        }
        store = Store.create(f"s3://hora-tests/retry-{uuid.uuid4().hex[:8]}", **options)
        info = materialize(df, store, ["x"], ["y"], num_proc=2, rows_per_row_group=500)
        seen = []
        for rank in range(2):
            reader = make_reader(store, info, "train", rank=rank, size=2, batch_size=256, shuffle=False,
                                 remainder="truncate")
            for batch in reader:
                seen.append(batch["x"])
        values = np.concatenate(seen)
        injected = proxy.counts["failed"] + proxy.counts["reset"]
    assert len(values) == len(set(values.tolist()))
    assert set(values.tolist()) <= set(range(n)) and len(values) >= n - 2
    assert injected >= 10, proxy.counts
    assert sum(retry.retry_counts().values()) > 0


def test_limited_caps_the_budget_in_this_thread_only(monkeypatch):
    monkeypatch.setenv("HORA_STORE_RETRY_S", "120")
    seen = {}
    with retry.limited(5.0):
        assert retry.budget_s() == 5.0
        with retry.limited(10.0):  # never widens an outer cap
            assert retry.budget_s() == 5.0
        import threading

        t = threading.Thread(target=lambda: seen.setdefault("other", retry.budget_s()))
        t.start()
        t.join()
    assert seen["other"] == 120.0
    assert retry.budget_s() == 120.0


@pytest.mark.timeout(120)
def test_an_s3_store_that_always_fails_gives_up_within_the_budget_naming_url_and_operation(s3_endpoint, monkeypatch):
    import s3fs

    from benchmarks._common.s3_faults import FaultyProxy

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setenv("HORA_STORE_RETRY_S", "2")
    with FaultyProxy(s3_endpoint, fail=1.0, seed=1) as proxy:
        options = {"key": "testing", "secret": "testing", "anon": False,
                   "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
                   "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}}
        store = Store.create(f"s3://hora-tests/down-{uuid.uuid4().hex[:8]}", check_writable=False, **options)
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"write s3://hora-tests/down-\w+/runs/r/history\.json failed: .*"
                                             r"gave up after \d+ attempt"):
            store.write_json("runs/r/history.json", {"loss": [1.0]})
        assert time.monotonic() - start < 2 + 30
        assert proxy.counts["failed"] >= 2 and proxy.counts["forwarded"] == 0
