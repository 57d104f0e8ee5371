"""Checksums of what a Store commits, and their checks.

Every Parquet file of a committed dataset and every checkpoint carries a checksum of its
bytes (XXH3's 64 bits, ``"xxh3-64:0123456789abcdef"``, by the ``xxhash`` package: about 18 GB/s
here, so it costs a few milliseconds a checkpoint; records written as ``"crc32:..."`` by earlier
versions are still checked, with zlib's CRC-32), computed where the bytes are written, before they leave the machine: a local file (a Parquet part, a spooled
upload, a shard) right after it is closed, from the page cache (:func:`local_file_checksum`);
a checkpoint's bytes and a distributed checkpoint's shards while they are written
(:func:`save_checkpoint`, :class:`HashingFile`):

* a dataset's files: their size and checksum are in the dataset's ``_metadata.json``,
  which the commit marker names by its SHA-256; the files also carry Parquet's own page
  CRCs, which the reader checks on every page it reads (no extra I/O);
* a checkpoint ``epoch-000007.ckpt``: its size and checksum in ``epoch-000007.ckpt.sum``
  next to it (:func:`save_checkpoint`), and the shards of a distributed checkpoint in its
  folder's ``.hora-checksums.json`` (:mod:`hora.estimators.frameworks.torch.dcp`).

A file whose bytes do not match raises :class:`~hora.errors.DataError` naming the file
(:func:`check_bytes`, :func:`verify_file`). What was written before checksums existed has
none: it is read unverified, which is said once per process in the log.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from typing import IO, Any

import xxhash

from hora.errors import DataError, StoreError

logger = logging.getLogger(__name__)

#: the algorithm of new records; ``ALGORITHMS`` are those a record may name
ALGORITHM = "xxh3-64"
ALGORITHMS = ("xxh3-64", "crc32")
#: the suffix of a checkpoint's checksum record (``epoch-000007.ckpt.sum``)
CHECKSUM_SUFFIX = ".sum"
CHUNK_BYTES = 8 << 20

_unverified_said: set[str] = set()
_said_lock = threading.Lock()


class Hasher:
    """A running checksum of bytes (``update``), spelled ``"<algorithm>:<hex>"`` (:meth:`hexdigest`).

    ``algorithm`` is one of :data:`ALGORITHMS`: new records use :data:`ALGORITHM`; a record's own
    algorithm (:func:`algorithm_of`) checks what an earlier version wrote."""

    __slots__ = ("algorithm", "size", "_xxh", "_crc")

    def __init__(self, algorithm: str = ALGORITHM) -> None:
        if algorithm not in ALGORITHMS:
            raise DataError(f"unknown checksum algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
        self.algorithm = algorithm
        self.size = 0
        self._xxh = xxhash.xxh3_64() if algorithm == "xxh3-64" else None
        self._crc = 0

    def update(self, data: Any) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)
        self.size += memoryview(data).nbytes

    def hexdigest(self) -> str:
        if self._xxh is not None:
            return f"{self.algorithm}:{self._xxh.hexdigest()}"
        return f"{self.algorithm}:{self._crc & 0xFFFFFFFF:08x}"


def algorithm_of(checksum: str | None) -> str:
    """The algorithm a recorded checksum names (``"crc32:1a2b3c4d"`` -> ``"crc32"``); :data:`ALGORITHM`
    for None.

    Raises:
        DataError: the record names no algorithm hora knows.
    """
    if checksum is None:
        return ALGORITHM
    name = checksum.partition(":")[0]
    if name not in ALGORITHMS:
        raise DataError(f"checksum {checksum!r} names an unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")
    return name


def checksum_bytes(data: Any, algorithm: str = ALGORITHM) -> str:
    """The checksum of ``data`` (bytes-like)."""
    h = Hasher(algorithm)
    h.update(data)
    return h.hexdigest()


class HashingFile:
    """A binary file open for writing that checksums what goes through it (for writers that
    take a file object: Parquet, torch.save). ``checksum`` and ``size`` after the last write.
    XXH3 takes about 4 ms for 64 MiB here: hashed in line, before the bytes are written."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.hasher = Hasher()
        self.closed = False
        self.mode = "wb"

    def write(self, data: Any) -> int:
        self.hasher.update(data)
        return self._fh.write(data)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.hasher.size

    def flush(self) -> None:
        self._fh.flush()

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._fh.close()

    @property
    def checksum(self) -> str:
        return self.hasher.hexdigest()

    @property
    def size(self) -> int:
        return self.hasher.size

    def __enter__(self) -> "HashingFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def local_file_checksum(path: str) -> tuple[str, int]:
    """``(checksum, size)`` of a local file just written (still in the page cache: no disk read),
    mapped into memory and checksummed by zlib without a copy."""
    import mmap
    import os

    h = Hasher()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                h.update(view)
    return h.hexdigest(), size


def unverified(kind: str, url: str) -> None:
    """Say once per process and kind that a file without a recorded checksum is read unverified."""
    with _said_lock:
        if kind in _unverified_said:
            return
        _unverified_said.add(kind)
    logger.info("%s %s has no recorded checksum (written before hora recorded them): read unverified; "
                "further ones are not reported", kind, url)


def check_bytes(data: bytes, expected: str | None, size: int | None, what: str) -> None:
    """Check ``data`` against its recorded checksum and size (None: nothing recorded, no check).

    Raises:
        DataError: the bytes are fewer or more than recorded (a truncated file) or differ
            (``what`` names the file and where it belongs).
    """
    if size is not None and len(data) != size:
        raise DataError(f"{what} is damaged: {len(data)} bytes where {size} were committed (truncated or "
                        "overwritten after its commit)")
    if expected is not None:
        got = checksum_bytes(data, algorithm_of(expected))
        if got != expected:
            raise DataError(f"{what} is damaged: its bytes have checksum {got}, {expected} was committed "
                            "(changed after its commit)")


def file_checksum(store: Any, path: str, algorithm: str = ALGORITHM) -> tuple[str, int]:
    """``(checksum, size)`` of a file in ``store``, read once in chunks (retried as the Store retries).

    Raises:
        StoreError: it cannot be read.
    """
    h = Hasher(algorithm)
    with store.open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK_BYTES)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest(), h.size


def verify_file(store: Any, path: str, expected: str | None, size: int | None, what: str) -> None:
    """Read a file of ``store`` whole and check it against its recorded checksum and size.

    Raises:
        DataError: it is missing, truncated or changed (``what`` names it).
        StoreError: the store cannot be read.
    """
    if not store.exists(path):
        raise DataError(f"{what} is missing from the store")
    got, n = file_checksum(store, path, algorithm_of(expected))
    if size is not None and n != size:
        raise DataError(f"{what} is damaged: {n} bytes where {size} were committed (truncated or overwritten "
                        "after its commit)")
    if expected is not None and got != expected:
        raise DataError(f"{what} is damaged: its bytes have checksum {got}, {expected} was committed "
                        "(changed after its commit)")


def check_sizes(store: Any, info: Any) -> None:
    """Check that every file of a committed dataset (a ``DatasetInfo``) is there with its committed size:
    the cheap check made before a committed dataset is reused (a stat or HEAD per file; the bytes
    themselves are checked by the readers, page by page).

    Raises:
        DataError: a file is missing or truncated (names the file and the dataset).
        StoreError: the store cannot be read.
    """
    for split in ("train", "val"):
        for fi in info.split_files(split):
            if fi.size is None:
                continue
            path = f"{info.dataset_dir}/{fi.path}"
            what = f"Parquet file {store.url_for(path)} of dataset {info.fingerprint}"
            try:
                size = store.size(path)
            except StoreError as exc:
                if store.exists(path):
                    raise
                raise DataError(f"{what} is missing from the store") from exc
            if size != fi.size:
                raise DataError(f"{what} is damaged: {size} bytes where {fi.size} were committed (truncated or "
                                "overwritten after its commit)")


# checkpoints ------------------------------------------------------------------------------
def checkpoint_record(data: bytes) -> bytes:
    """The content of a checkpoint's checksum record."""
    return json.dumps({"checksum": checksum_bytes(data), "size": len(data)}).encode("utf-8")


def save_checkpoint(store: Any, path: str, data: bytes) -> None:
    """Write a checkpoint and its checksum record (``path + ".sum"``), each atomically.

    The old record goes first, so that a crash between the two writes leaves a checkpoint
    without a record (read unverified), never a new checkpoint beside the old record. The
    checksum is computed in a thread while the checkpoint is written (zlib releases the GIL),
    and the small record is not flushed to a local disk on its own (lost in a power cut, the
    checkpoint is read unverified): the commit costs about what it did without checksums.
    """
    store.rm(path + CHECKSUM_SUFFIX)
    record = checkpoint_record(data)
    store.write_bytes(path, data)
    store.write_bytes(path + CHECKSUM_SUFFIX, record, sync=False)


def read_checkpoint(store: Any, path: str, what: str) -> bytes:
    """The bytes of a checkpoint, checked against its record when it has one.

    Raises:
        DataError: they do not match the record (truncated or changed), or the record is unreadable.
        StoreError: the store cannot be read.
    """
    data = store.read_bytes(path)
    record_path = path + CHECKSUM_SUFFIX
    if not store.exists(record_path):
        unverified("checkpoint", store.url_for(path))
        return data
    raw = store.read_bytes(record_path)
    if not raw:  # a record lost in a power cut before it reached the disk (never written empty)
        unverified("checkpoint", store.url_for(path))
        return data
    try:
        record = json.loads(raw)
        expected, size = str(record["checksum"]), int(record["size"])
    except (ValueError, KeyError, TypeError, StoreError) as exc:
        raise DataError(f"{what}: its checksum record {store.url_for(record_path)} is unreadable "
                        f"({type(exc).__name__}: {exc})") from exc
    check_bytes(data, expected, size, what)
    return data


__all__ = ["ALGORITHM", "ALGORITHMS", "algorithm_of", "CHECKSUM_SUFFIX", "Hasher", "HashingFile", "local_file_checksum", "checksum_bytes", "check_bytes", "file_checksum",
           "verify_file", "check_sizes", "unverified", "save_checkpoint", "read_checkpoint", "checkpoint_record"]
