"""What the Store's checksums cost: materialization and checkpoint commits with and without them.

Run: ``.venv/bin/python benchmarks/bench_checksums.py [--rows 400000] [--rounds 5] [--ckpt-mib 64]``.

In one process, on a ``file://`` Store in a temporary folder, one kind at a time, alternating with
and without checksums (``--rounds`` each, the median reported), each timed call after ``os.sync()``
(so that a commit's fsync flushes only its own file):

* materialize a pandas frame (``--rows`` rows: a 32-float feature array and a label) with
  ``overwrite=True``: with each file's checksum (XXH3) taken after it is written and Parquet's page
  CRCs, against neither (``hora.store.writer.CHECKSUMS`` off);
* commit a checkpoint of ``--ckpt-mib`` MiB: ``Store.save_checkpoint`` (the file and its
  checksum record) against the plain atomic write it was before (``Store.write_bytes``);
* save an FSDP-style distributed checkpoint of the same size in this process (torch's DCP,
  one rank) with hora's ``StoreWriter``, each file checksummed while written against not;
  and, for reference, torch's ``FsspecWriter`` (what hora used before, outside the Store's
  retries) against the ``StoreWriter`` with checksums.

Prints one markdown table: what | without checksums (s) | with (s) | ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 32)).astype("float32")
    return pd.DataFrame({"features": list(x), "y": (x[:, 0] > 0).astype("float64")})


def _materialize(store, pdf: pd.DataFrame, checksums: bool) -> float:
    from hora.store import materialize, writer

    writer.CHECKSUMS = checksums
    try:
        start = time.perf_counter()
        info = materialize(pdf, store, ["features"], ["y"], num_proc=4, overwrite=True)
        seconds = time.perf_counter() - start
    finally:
        writer.CHECKSUMS = True
    assert all((f.checksum is not None) == checksums for f in info.split_files("train"))
    return seconds


def _commit(store, data: bytes, checksums: bool, epoch: int) -> float:
    start = time.perf_counter()
    if checksums:
        store.save_checkpoint("bench", epoch, data)
    else:
        store.write_bytes(store.layout.checkpoint_path("bench", epoch), data)
    return time.perf_counter() - start


def _no_hash() -> type:
    """A HashingFile that does not checksum what it writes (the baseline of the distributed checkpoint's row)."""
    from hora.store.integrity import HashingFile

    class NoHash(HashingFile):
        def write(self, data) -> int:
            return self._fh.write(data)

    return NoHash


def _dcp(store, state: dict, checksums: bool, n: int, fsspec: bool = False) -> float:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from hora.estimators.frameworks.torch.dcp import StoreWriter
    from hora.store import integrity

    path = f"{store.layout.checkpoint_dir('bench')}/dcp-{n}-{int(checksums)}-{int(fsspec)}"
    writer = (FsspecWriter(store.url_for(path), single_file_per_rank=True, sync_files=False) if fsspec
              else StoreWriter(store, path))
    keep = integrity.HashingFile
    if not checksums:
        integrity.HashingFile = _no_hash()  # type: ignore[misc]
    try:
        start = time.perf_counter()
        dcp.save(state, storage_writer=writer)
        return time.perf_counter() - start
    finally:
        integrity.HashingFile = keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ckpt-mib", type=int, default=64)
    args = ap.parse_args()
    import torch

    from hora.store import Store

    pdf = _frame(args.rows)
    n_floats = args.ckpt_mib * (1 << 20) // 4
    state = {"model": {f"w{i}": torch.randn(n_floats // 8) for i in range(8)}}
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    times: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.create(f"file://{tmp}/store")
        _materialize(store, pdf, True)  # warm-up (imports, page cache)
        _dcp(store, state, True, -1)
        # one kind at a time, alternated with and without, each timed call after os.sync(): a commit's
        # fsync otherwise also flushes whatever the previous call left dirty (a materialization's files)
        def timed(what: str, checksums: bool, fn: Any) -> None:
            os.sync()
            times.setdefault((what, checksums), []).append(fn())

        for r in range(args.rounds):
            for checksums in ((False, True) if r % 2 == 0 else (True, False)):  # alternated
                timed("materialize", checksums, lambda: _materialize(store, pdf, checksums))
        for r in range(args.rounds):
            for checksums in ((False, True) if r % 2 == 0 else (True, False)):
                timed("commit", checksums, lambda: _commit(store, data, checksums, r))
        for r in range(args.rounds):
            for checksums in ((False, True) if r % 2 == 0 else (True, False)):
                timed("dcp", checksums, lambda: _dcp(store, state, checksums, r))
        for r in range(args.rounds):  # hora's writer (retried through the Store, checksummed) against torch's own
            for fsspec in ((True, False) if r % 2 == 0 else (False, True)):
                timed("fsspec", not fsspec, lambda: _dcp(store, state, True, r + 1000 * (1 + fsspec), fsspec=fsspec))
    label = {"materialize": f"materialize {args.rows} rows x 33 columns (4 files)",
             "commit": f"checkpoint commit, {len(data) >> 20} MiB (Store.save_checkpoint)",
             "dcp": f"distributed checkpoint save, {len(data) >> 20} MiB (DCP, 1 rank, hora's StoreWriter)",
             "fsspec": "the same: torch's FsspecWriter (before) against hora's StoreWriter with checksums (now)"}
    print()
    print(f"| {args.rounds} rounds each, alternated, median | without checksums (s) | with checksums (s) | ratio |")
    print("|---|---:|---:|---:|")
    for what in ("materialize", "commit", "dcp", "fsspec"):
        off, on = statistics.median(times[(what, False)]), statistics.median(times[(what, True)])
        print(f"| {label[what]} | {off:.3f} | {on:.3f} | {on / off:.3f} x |")
    # what the checksum itself adds to a commit, apart from the disk's noise (a commit's fsync on a shared
    # disk varies several-fold from one call to the next)
    from hora.store import integrity

    hashing = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        integrity.checkpoint_record(data)
        hashing.append(time.perf_counter() - start)
    off = statistics.median(times[("commit", False)])
    on = off + statistics.median(hashing)
    print(f"| the commit's checksum alone ({integrity.ALGORITHM} of {len(data) >> 20} MiB), added to the commit "
          f"without | {off:.3f} | {on:.3f} | {on / off:.3f} x |")


if __name__ == "__main__":
    main()
