"""Per-rank streaming reader of a materialized dataset: sharding, shuffling, prefetch.

How rows are shared (identical arithmetic on every rank, from the metadata alone):

1. The split's row groups are put in one order: shuffled per epoch with
   ``(seed, epoch)`` (the same on all ranks), or file order without shuffling.
2. That order defines a sequence of all ``N`` rows; rank ``r`` of ``size`` takes the
   contiguous range ``[r * per, (r + 1) * per)`` of it, cutting row groups where needed.
   ``remainder="pad"`` (default, like torch's DistributedSampler): ``per = ceil(N / size)``
   and the range wraps around, so the last ranks re-read a few rows from the start of
   the order; ``remainder="truncate"``: ``per = N // size`` and the last ``N % size``
   rows of the order are skipped this epoch (others next epoch, when shuffling).
   Either way every rank reads exactly ``per`` rows, so ``len(reader)`` (batches) is
   the same on every rank; when ``size`` divides ``N`` every row is read exactly once.
3. A rank streams its row groups one at a time. With shuffling, rows are mixed in a
   window of ``shuffle_buffer_size`` rows (one random permutation, applied as each batch
   gathers its rows, no per-row Python), and the rows left over after the last full batch
   of a window carry into the next one. Memory stays around the shuffle buffer, one row group and the
   prefetched batches, whatever the dataset's size.
4. A background thread prepares batches ahead and hands them over in runs of up to
   :data:`HANDOVER_BYTES` (``prefetch`` runs queued): one hand-over between threads per
   run, not per batch, which on a CPU-bound rank costs more than the batch itself. The
   first run of an epoch is one batch and each next one twice as long, so the first step
   waits for one batch only.

Feature groups (``groups``): scalar columns that a model takes as one ``(rows, k)``
input are stacked once per row group, as it is read (straight into the shuffle window when
shuffling), so the shuffle and every batch move one 2-d array instead of ``k`` columns,
and nothing is stacked per batch.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np
import pyarrow.parquet as pq

from hora import settings
from hora.errors import ConfigError, DataError, StoreError
from hora.store.arrow_arrays import column_to_numpy, group_spec, put_column, row_bytes_of, stack_members
from hora.store.background import POLL_S, Tracker, in_background
from hora.store.dataset import ColumnSpec, DatasetInfo, FileInfo
from hora.store.integrity import unverified, verify_file
from hora.store.layout import SPLITS
from hora.store.segments import Segment, plan_segments
from hora.store.store import Store

logger = logging.getLogger(__name__)

#: Default cap of the shuffle buffer, in rows and in bytes (the smaller wins).
DEFAULT_SHUFFLE_BUFFER_ROWS = 100_000
DEFAULT_SHUFFLE_BUFFER_BYTES = 256 << 20
#: Seconds the consumer waits for the next batch from the prefetch thread (env override below).
ENV_READER_TIMEOUT = "HORA_READER_TIMEOUT"
DEFAULT_READER_TIMEOUT_S = settings.default(ENV_READER_TIMEOUT)
_REMAINDERS = ("pad", "truncate")
#: Bytes of batches the prefetch thread hands over at once (at most 64 batches, at least one).
HANDOVER_BYTES = 4 << 20
_HANDOVER_MAX = 64
#: The batch column of ``make_reader(row_ids=True)``: where each row is stored (:func:`row_position`).
ROW_ID = "__hora_row__"


def row_position(reader: "Reader", row_id: int) -> str:
    """Where a row of ``reader``'s split is stored, for messages: ``"row 17 of train/part-00001-....parquet"``
    (the row's position in the file its input partition was written to)."""
    file, row = int(row_id) >> 40, int(row_id) & ((1 << 40) - 1)
    name = reader.file_names[file] if 0 <= file < len(reader.file_names) else f"file {file}"
    return f"row {row} of {name}"


# Every live background thread of every reader, so they can be stopped before the interpreter
# finalizes (a daemon thread still inside Arrow's C++ at exit would abort the process).
_LIVE: set[tuple[threading.Thread, threading.Event]] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all_readers() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for _, stop in live:
        stop.set()
    for thread, _ in live:
        thread.join(timeout=5 * POLL_S)


class _Threads(Tracker):
    """A reader's background threads, and every reader's (for the ``atexit`` hook above)."""

    def __init__(self, reader: "Reader") -> None:
        self.reader = reader

    def started(self, thread: threading.Thread, stop: threading.Event) -> None:
        with self.reader._live_lock:
            self.reader._live.append((thread, stop))
        with _LIVE_LOCK:
            for entry in [e for e in _LIVE if not e[0].is_alive()]:
                _LIVE.discard(entry)
            _LIVE.add((thread, stop))

    def joined(self, thread: threading.Thread, stop: threading.Event, alive: bool) -> None:
        if alive:
            return
        with self.reader._live_lock:
            self.reader._live = [(t, e) for t, e in self.reader._live if t is not thread]
        with _LIVE_LOCK:
            _LIVE.discard((thread, stop))


def reader_timeout() -> float:
    """Seconds to wait for one batch (``HORA_READER_TIMEOUT`` or the default)."""
    return settings.get(ENV_READER_TIMEOUT)


def _what(store: Store, path: str, info: DatasetInfo) -> str:
    return f"Parquet file {store.url_for(path)} of dataset {info.fingerprint}"


def open_verified(store: Store, path: str, fi: FileInfo, info: DatasetInfo) -> tuple[Any, pq.ParquetFile]:
    """``(file handle or None, ParquetFile)`` of a dataset's file, its size checked against the
    recorded one and every page it reads checked against its CRC (Parquet's page checksums).

    Raises:
        DataError: the file is missing or its size is not the committed one (names the file and dataset).
        StoreError: the store cannot be read.
    """
    if fi.checksum is None:
        unverified("Parquet file", store.url_for(path))
    if store.is_local:
        if fi.size is not None:
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                raise DataError(f"{_what(store, path, info)} is missing from the store") from None
            if size != fi.size:
                raise DataError(f"{_what(store, path, info)} is damaged: {size} bytes where {fi.size} were committed "
                                "(truncated or overwritten after its commit)")
        return None, pq.ParquetFile(path, page_checksum_verification=True)
    fh: Any = store.open(path, "rb")  # (a ResumableReader: it knows its size)
    if fi.size is not None and fh.size() != fi.size:
        fh.close()
        raise DataError(f"{_what(store, path, info)} is damaged: {fh.size()} bytes where {fi.size} were committed "
                        "(truncated or overwritten after its commit)")
    return fh, pq.ParquetFile(fh, page_checksum_verification=True)


class _Chunk(NamedTuple):
    """The rows of one planned segment: numpy columns, a feature group as its members (not yet stacked)."""

    rows: int
    columns: dict[str, np.ndarray | tuple[np.ndarray, ...]]


class Reader:
    """Iterates the batches of one rank for one epoch (see :func:`make_reader`).

    ``len(reader)`` is the number of batches, equal on all ranks. Iterating again
    replays the same epoch; :meth:`set_epoch` moves to another one. Use as a context
    manager or call :meth:`close` to stop a prefetch thread early (it is a daemon and
    also stops when the iteration is abandoned).
    """

    def __init__(
        self,
        store: Store,
        info: DatasetInfo,
        split: str,
        rank: int,
        size: int,
        batch_size: int,
        epoch: int,
        seed: int,
        shuffle: bool,
        shuffle_buffer_size: int | None,
        columns: Sequence[str] | None,
        prefetch: int,
        remainder: str,
        drop_last: bool,
        groups: Mapping[str, Sequence[str]] | None = None,
        batch_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        row_ids: bool = False,
    ) -> None:
        self.store = store
        self.info = info
        self.split = split
        self.rank = rank
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.prefetch = prefetch
        self.remainder = remainder
        self.drop_last = drop_last
        #: the names a batch holds: stored columns and group keys, in order
        self.columns = list(columns) if columns is not None else list(info.columns)
        self.groups = {k: tuple(v) for k, v in (groups or {}).items() if k in self.columns}
        #: the stored columns read from the files (a group's members once each)
        self.stored = list(dict.fromkeys(
            m for c in self.columns for m in (self.groups[c] if c in self.groups else (c,))))
        self.specs = {c: group_spec(info, c, self.groups[c]) if c in self.groups else info.columns[c]
                      for c in self.columns}
        #: applied to every batch in the prefetch thread (decoding, padding; see make_reader)
        self.batch_fn = batch_fn
        #: a :class:`hora.store.process_reader.ProcessPool` reading the row groups in worker processes
        #: (``reader_pool_type='process'``), else None: read in this reader's thread
        self.read_pool: Any = None
        #: each batch carries ROW_ID: where each row is stored (:func:`row_position`)
        self.row_ids = bool(row_ids)
        if self.row_ids:
            self.columns.append(ROW_ID)
            self.specs[ROW_ID] = ColumnSpec("int64")
        self.files = info.file_paths(split)
        file_infos = info.split_files(split)
        self.file_infos = file_infos
        self.file_names = [f.path for f in file_infos]
        self._group_rows = [(i, g, rows) for i, f in enumerate(file_infos) for g, rows in enumerate(f.row_groups)]
        self._group_start = {(i, g): int(sum(f.row_groups[:g])) for i, f in enumerate(file_infos)
                             for g in range(len(f.row_groups))}
        row_bytes = sum(row_bytes_of(s) for s in self.specs.values())
        if shuffle_buffer_size is None:
            shuffle_buffer_size = max(batch_size, min(DEFAULT_SHUFFLE_BUFFER_ROWS, DEFAULT_SHUFFLE_BUFFER_BYTES // max(1, row_bytes)))
        self.shuffle_buffer_size = shuffle_buffer_size
        self._live: list[tuple[threading.Thread, threading.Event]] = []
        self._live_lock = threading.Lock()
        self.set_epoch(epoch)

    # planning ---------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next (a different shuffle, the same number of batches)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch
        self.segments, self.rows = plan_segments(
            self._group_rows, self.rank, self.size, epoch, self.seed, self.shuffle, self.remainder
        )

    def __len__(self) -> int:
        if self.drop_last:
            return self.rows // self.batch_size
        return -(-self.rows // self.batch_size)

    def __repr__(self) -> str:
        return (f"Reader(split={self.split!r}, rank={self.rank}/{self.size}, epoch={self.epoch}, "
                f"rows={self.rows}, batches={len(self)})")

    # reading ----------------------------------------------------------------------------
    def _row_groups(self) -> Iterator[_Chunk]:
        """Yields the rows of each planned segment, in order (opening each file once); a feature
        group comes as its member columns, stacked where the rows land (:func:`_put`)."""
        handles: dict[int, tuple[Any, pq.ParquetFile]] = {}
        member = {c: ColumnSpec(self.specs[c].dtype) for c in self.groups}  # a group member's spec
        pooled = (self.read_pool.tables(self.store, self.files, self.segments, self.stored,
                                        verify=(self.file_infos, self.info))
                  if self.read_pool is not None else None)
        try:
            for seg in self.segments:
                if pooled is not None:
                    try:
                        table = next(pooled)
                    except StoreError as exc:  # (a DataError passes: the process found the file damaged)
                        raise self._damaged(seg.file, exc) from None
                elif seg.file not in handles:
                    path = self.files[seg.file]
                    try:
                        fh, pf = open_verified(self.store, path, self.file_infos[seg.file], self.info)
                    except (StoreError, DataError):
                        raise
                    except Exception as exc:
                        error = self._damaged(seg.file, StoreError(
                            f"cannot open {self.store.url_for(path)}: {type(exc).__name__}: {exc}"))
                        raise error from (None if isinstance(error, DataError) else exc)
                    handles[seg.file] = (fh, pf)
                if pooled is None:
                    pf = handles[seg.file][1]
                    try:
                        table = pf.read_row_group(seg.row_group, columns=self.stored, use_threads=True)
                    except Exception as exc:
                        error = self._damaged(seg.file, StoreError(
                            f"cannot read row group {seg.row_group} of {self.store.url_for(self.files[seg.file])}: "
                            f"{type(exc).__name__}: {exc}"))
                        raise error from (None if isinstance(error, DataError) else exc)  # (not Arrow's traceback)
                cut = slice(seg.start, seg.stop)
                columns: dict[str, np.ndarray | tuple[np.ndarray, ...]] = {}
                for c in self.columns:
                    if c == ROW_ID:
                        first = self._group_start[(seg.file, seg.row_group)] + seg.start
                        columns[c] = (np.int64(seg.file) << 40) + np.arange(first, first + seg.rows, dtype=np.int64)
                    elif c in self.groups:
                        columns[c] = tuple(column_to_numpy(table.column(m), member[c], m)[cut] for m in self.groups[c])
                    else:
                        columns[c] = column_to_numpy(table.column(c), self.specs[c], c)[cut]
                yield _Chunk(seg.rows, columns)
        finally:
            if pooled is not None:
                pooled.close()
            for fh, _ in handles.values():
                if fh is not None:
                    fh.close()

    def _damaged(self, file: int, error: Exception) -> Exception:
        """The error to raise for a file Arrow failed to open or read: a DataError naming it when its
        bytes no longer match their recorded checksum (read whole, once, only on this failure), else ``error``."""
        what = _what(self.store, self.files[file], self.info)
        fi = self.file_infos[file]
        if fi.checksum is None:
            return error
        try:
            verify_file(self.store, self.files[file], fi.checksum, fi.size, what)
        except DataError as exc:
            return exc
        except StoreError:
            return error
        return error

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The batches of this epoch, produced in the calling thread."""
        chunks = self._chunks()
        try:
            emitted = 0
            for batch in (self._shuffled(chunks) if self.shuffle else self._sequential(chunks)):
                if emitted >= len(self):
                    break
                yield batch if self.batch_fn is None else self.batch_fn(batch)
                emitted += 1
        finally:
            chunks.close()
        if emitted != len(self):  # pragma: no cover - a planning bug would show here, not as a hang
            raise StoreError(f"reader rank {self.rank}: produced {emitted} batches, planned {len(self)}")

    def windows(self) -> list[int]:
        """The rows of each shuffle window, in order: whole row groups (segments) until
        ``shuffle_buffer_size`` is reached, and the rest in the last one."""
        windows: list[int] = []
        acc = 0
        for seg in self.segments:
            acc += seg.rows
            if acc >= self.shuffle_buffer_size:
                windows.append(acc)
                acc = 0
        if acc:
            windows.append(acc)
        return windows

    def _shuffled(self, chunks: Iterator[_Chunk]) -> Iterator[dict[str, np.ndarray]]:
        """Windows of about ``shuffle_buffer_size`` rows, each mixed by one random permutation.

        Window sizes follow from the plan, so each row group is copied into the window (in
        reading order, feature groups stacked on the way) as soon as it is read and then
        released: memory holds one window plus a row group. Row ``i`` of a window in reading
        order is row ``dest[i]`` of the mixed window; each batch gathers its rows through the
        inverse permutation, a copy that the batch needs anyway (a scatter into the window
        followed by a copy of each batch moved every row twice).
        """
        bs = self.batch_size
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 0xB0F])
        windows = self.windows()
        carry: dict[str, np.ndarray] | None = None
        carry_rows = 0
        source = iter(chunks)
        for wi, wrows in enumerate(windows):
            total = wrows + carry_rows
            dest = rng.permutation(total)  # row i of the window (reading order) is mixed row dest[i]
            src = np.empty_like(dest)
            src[dest] = np.arange(total)  # mixed row p is row src[p] in reading order
            del dest
            window = {c: np.empty((total, *s.batch_shape), dtype=s.batch_dtype) for c, s in self.specs.items()}
            pos = 0
            if carry is not None:
                for c in self.columns:
                    window[c][:carry_rows] = carry[c]
                pos = carry_rows
            while pos < total:
                try:
                    chunk = next(source)
                except StopIteration:  # pragma: no cover - would be a planning bug
                    raise StoreError(f"reader rank {self.rank}: row groups ended before the planned rows") from None
                for c in self.columns:
                    put_column(window[c][pos : pos + chunk.rows], chunk.columns[c])
                pos += chunk.rows
                del chunk
            upto = total if wi == len(windows) - 1 else (total // bs) * bs
            # the rows short of a full batch are copied (small) into the next window
            carry = {c: window[c].take(src[upto:], axis=0) for c in self.columns} if upto < total else None
            carry_rows = total - upto
            for start in range(0, upto, bs):
                rows = src[start : min(start + bs, upto)]
                yield {c: window[c].take(rows, axis=0) for c in self.columns}
            del window

    def _sequential(self, chunks: Iterator[_Chunk]) -> Iterator[dict[str, np.ndarray]]:
        bs = self.batch_size
        pending: list[dict[str, np.ndarray]] = []
        pending_rows = 0
        for read in chunks:
            n = read.rows
            chunk = {c: stack_members(a) if isinstance(a, tuple) else a for c, a in read.columns.items()}
            start = 0
            while start < n:
                if pending_rows == 0 and n - start >= bs:
                    yield {c: a[start : start + bs] for c, a in chunk.items()}
                    start += bs
                    continue
                take = min(bs - pending_rows, n - start)
                pending.append({c: a[start : start + take] for c, a in chunk.items()})
                pending_rows += take
                start += take
                if pending_rows == bs:
                    yield {c: np.concatenate([p[c] for p in pending]) for c in self.columns}
                    pending, pending_rows = [], 0
        if pending_rows:
            yield {c: np.concatenate([p[c] for p in pending]) for c in self.columns}

    def _chunks(self) -> Iterator[_Chunk]:
        """Row-group chunks, read one ahead in a background thread when prefetching (Parquet
        decoding releases the GIL, so it overlaps with the shuffle of the previous window)."""
        if self.prefetch <= 0:
            return self._row_groups()
        return self._in_background(self._row_groups, 1, "io")

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.prefetch <= 0:
            yield from self._batches()
            return
        for run in self._in_background(self._runs, self.prefetch, "batches"):
            yield from run

    def _runs(self) -> Iterator[list[dict[str, np.ndarray]]]:
        """The epoch's batches in lists (the prefetch thread's hand-overs): the first holds one batch,
        each next one twice as many, up to about :data:`HANDOVER_BYTES`. The step starts as soon
        as the first batch is made, not when a whole run is (with a ``batch_fn`` that decodes
        images, a 4 MiB run of small images was the whole epoch, decoded before the first step
        and overlapping none of them)."""
        row_bytes = sum(row_bytes_of(s) for s in self.specs.values())
        per = max(1, min(_HANDOVER_MAX, HANDOVER_BYTES // max(1, row_bytes * self.batch_size)))
        run: list[dict[str, np.ndarray]] = []
        limit = 1
        for batch in self._batches():
            if self.batch_fn is not None and not run:  # what batch_fn made: size the run by its bytes
                size = sum(getattr(a, "nbytes", 0) for a in batch.values()) if isinstance(batch, dict) else 0
                per = max(1, min(_HANDOVER_MAX, HANDOVER_BYTES // max(1, size)))
            run.append(batch)
            if len(run) >= min(limit, per):
                yield run
                run = []
                limit *= 2
        if run:
            yield run

    def _in_background(self, make_iter: Any, maxsize: int, what: str) -> Iterator[Any]:
        """``make_iter()``'s items from a daemon thread (:func:`hora.store.background.in_background`);
        closing this generator stops the thread.

        Raises:
            StoreError: no item within the reader timeout (the message names rank, split, epoch).
        """

        def silent(timeout: float) -> StoreError:
            return StoreError(f"reader rank {self.rank} ({self.split}, epoch {self.epoch}): nothing from the "
                              f"{what} thread within {timeout:.0f} s (reading {self.store.url}; "
                              f"set {ENV_READER_TIMEOUT} to wait longer)")

        return in_background(
            make_iter, maxsize=maxsize, name=f"hora-reader-{what}-{self.split}-r{self.rank}-e{self.epoch}",
            timeout=reader_timeout(), silent=silent, tracker=_Threads(self),
            ended=lambda: StoreError(f"reader rank {self.rank}: the {what} thread ended without a result"))

    def close(self) -> None:
        """Stop any prefetch thread still running (returns within about a second)."""
        with self._live_lock:
            live = list(self._live)
        for _, stop in live:
            stop.set()
        for thread, _ in live:
            thread.join(timeout=5 * POLL_S)
        with self._live_lock:
            self._live = [(t, e) for t, e in self._live if t.is_alive()]

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def make_reader(
    store: Store,
    info: DatasetInfo,
    split: str = "train",
    rank: int = 0,
    size: int = 1,
    batch_size: int = 32,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer_size: int | None = None,
    columns: Sequence[str] | None = None,
    prefetch: int = 2,
    remainder: str = "pad",
    drop_last: bool = False,
    groups: Mapping[str, Sequence[str]] | None = None,
    batch_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
    row_ids: bool = False,
) -> Reader:
    """A reader of rank ``rank``'s share of ``split`` for one epoch.

    Every rank yields exactly ``len(reader)`` batches, the same number on all ranks.

    Args:
        store, info: the Store and the DatasetInfo from :func:`hora.store.materialize`.
        split: ``"train"`` or ``"val"``.
        rank, size: this rank and the number of ranks.
        batch_size: rows per batch (the last batch of an epoch may be smaller unless drop_last).
        epoch, seed: the shuffle of each epoch is seeded by (seed, epoch): the row-group
            order is identical on all ranks, the in-buffer mixing differs per rank.
        shuffle: shuffle row-group order and rows (through the shuffle buffer).
        shuffle_buffer_size: rows mixed together in memory (default: 100,000 rows or
            256 MiB, whichever is smaller, and at least one batch).
        columns: what each batch holds: stored columns and keys of ``groups``
            (default: all stored columns).
        prefetch: batches prepared ahead by a background thread (0: no thread).
        remainder: when rows do not divide by ``size``: ``"pad"`` re-reads a few rows
            so every row is seen, ``"truncate"`` drops the last rows of the shuffled order.
        drop_last: drop each rank's last partial batch.
        groups: feature groups, ``{key: member columns}``: a key named in ``columns``
            comes as one ``(rows, len(members))`` array of scalar members of one dtype,
            stacked in member order once per row group (the members are not in the
            batch unless ``columns`` names them too).

    Returns:
        a :class:`Reader`; ``for batch in reader`` gives ``dict[str, np.ndarray]`` with
        shapes ``(rows, *ColumnSpec.shape)`` (a binary, string, ragged or sparse column:
        a 1-d object array, see :attr:`ColumnSpec.kind`).

    Raises:
        ConfigError: bad rank/size/batch_size/split/columns/remainder.
        DataError: the split is empty.
    """
    if not isinstance(store, Store):
        raise ConfigError(f"store must be a hora.store.Store, got {type(store).__name__}")
    if not isinstance(info, DatasetInfo):
        raise ConfigError(f"info must be a DatasetInfo (from materialize), got {type(info).__name__}")
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    for name, value, low in (("size", size, 1), ("batch_size", batch_size, 1), ("rank", rank, 0),
                             ("seed", seed, None), ("prefetch", prefetch, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
            raise ConfigError(f"{name} must be an int" + (f" >= {low}" if low is not None else "") + f", got {value!r}")
    if rank >= size:
        raise ConfigError(f"rank {rank} is out of range for size {size}")
    if remainder not in _REMAINDERS:
        raise ConfigError(f"remainder must be one of {_REMAINDERS}, got {remainder!r}")
    if shuffle_buffer_size is not None and (
        isinstance(shuffle_buffer_size, bool) or not isinstance(shuffle_buffer_size, int) or shuffle_buffer_size < 1
    ):
        raise ConfigError(f"shuffle_buffer_size must be an int >= 1 or None, got {shuffle_buffer_size!r}")
    if groups is not None:
        if not isinstance(groups, Mapping):
            raise ConfigError(f"groups must map a group key to its columns, got {groups!r}")
        clash = [k for k in groups if k in info.columns]
        if clash:
            raise ConfigError(f"group keys {clash} are also stored column names")
        for key, members in groups.items():
            group_spec(info, key, list(members))
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        unknown = [c for c in columns if c not in info.columns and c not in (groups or {})]
        if unknown:
            raise ConfigError(f"columns {unknown} are not in the dataset; it has {list(info.columns)}")
        if not columns:
            raise ConfigError("columns must name at least one column (or be None for all)")
    if info.split_rows(split) == 0:
        raise DataError(
            f"the {split!r} split of dataset {info.fingerprint} is empty"
            + (" (materialize with validation=... to get one)" if split == "val" else "")
        )
    if batch_fn is not None and not callable(batch_fn):
        raise ConfigError(f"batch_fn must be callable, got {batch_fn!r}")
    reader = Reader(store, info, split, rank, size, batch_size, epoch, seed, bool(shuffle),
                    shuffle_buffer_size, columns, prefetch, remainder, bool(drop_last), groups, batch_fn, row_ids)
    if len(reader) == 0:
        logger.warning("reader rank %d: %d rows per rank and batch_size %d with drop_last give no batches",
                       rank, reader.rows, batch_size)
    return reader


__all__ = ["Reader", "make_reader", "plan_segments", "Segment", "ENV_READER_TIMEOUT", "DEFAULT_READER_TIMEOUT_S",
           "ROW_ID", "row_position", "row_bytes_of"]
