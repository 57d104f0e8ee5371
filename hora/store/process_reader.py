"""Row groups read and decoded in worker processes: a rank's reader with ``reader_pool_type='process'``.

By default a rank's :class:`~hora.store.Reader` reads its row groups in one background thread
(pyarrow decodes Parquet outside the GIL). With Horovod's ``reader_pool_type='process'`` the
files are opened and the row groups read and decoded by a pool of worker processes instead
(``mp_start_method``: ``'spawn'`` by default, ``'forkserver'`` or ``'fork'``), which hand each
row group back as an Arrow table; the reader keeps its order, its sharding and its shuffle.
Up to two row groups per process are read ahead. One pool per start method serves every reader
of the process (:func:`shared`); it ends when the process exits.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import multiprocessing
from typing import Any, Iterator, Sequence

from hora.errors import ConfigError, DataError, StoreError
from hora.store.reader import ENV_READER_TIMEOUT, reader_timeout

logger = logging.getLogger(__name__)

START_METHODS = ("spawn", "forkserver", "fork")
DEFAULT_PROCESSES = 2


def _read_row_group(store: Any, path: str, row_group: int, columns: Sequence[str], verify: Any = None) -> Any:
    """(in a worker process) One row group of one file as an Arrow table; with ``verify``
    (the file's committed ``FileInfo`` and its ``DatasetInfo``) its size and page checksums are checked
    as the thread reader checks them (a DataError naming the file)."""
    import pyarrow.parquet as pq

    if verify is not None:
        from hora.store.reader import open_verified

        fh, pf = open_verified(store, path, *verify)
        try:
            return pf.read_row_group(row_group, columns=list(columns), use_threads=True)
        finally:
            if fh is not None:
                fh.close()
    if store.is_local:
        return pq.ParquetFile(path).read_row_group(row_group, columns=list(columns), use_threads=True)
    with store.open(path, "rb") as fh:
        return pq.ParquetFile(fh).read_row_group(row_group, columns=list(columns), use_threads=True)


class ProcessPool:
    """The worker processes of one reader (created on first use; :meth:`close` ends them).

    Raises (constructor):
        ConfigError: an unknown ``start_method`` or a process count below 1.
    """

    def __init__(self, processes: int = DEFAULT_PROCESSES, start_method: str | None = None) -> None:
        start_method = start_method or "spawn"
        if start_method not in START_METHODS:
            raise ConfigError(f"mp_start_method must be one of {START_METHODS}, got {start_method!r}")
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ConfigError(f"the reader's process count must be an int >= 1, got {processes!r}")
        self.processes = processes
        self.start_method = start_method
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:  # a copy (a cached reader's) starts its own processes
        return {"processes": self.processes, "start_method": self.start_method, "_executor": None}

    def tables(self, store: Any, files: Sequence[str], segments: Sequence[Any], columns: Sequence[str],
               verify: tuple[Sequence[Any], Any] | None = None) -> Iterator[Any]:
        """The Arrow table of each segment's row group, in order, read ahead by the pool; with ``verify``
        (the files' committed ``FileInfo`` list and the ``DatasetInfo``) each file is checked as it is read.

        Raises:
            StoreError: a row group cannot be read (names the file), or no table came within the
                reader timeout (``HORA_READER_TIMEOUT``).
            DataError: with ``verify``, a file is missing or its bytes are not the committed ones.
        """
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context(self.start_method))
        timeout = reader_timeout()
        ahead = 2 * self.processes
        pending: list[tuple[Any, concurrent.futures.Future]] = []
        todo = iter(segments)
        try:
            while True:
                while len(pending) < ahead:
                    seg = next(todo, None)
                    if seg is None:
                        break
                    check = None if verify is None else (verify[0][seg.file], verify[1])
                    pending.append((seg, self._executor.submit(_read_row_group, store, files[seg.file],
                                                               seg.row_group, list(columns), check)))
                if not pending:
                    return
                seg, future = pending.pop(0)
                try:
                    yield future.result(timeout=timeout)
                except concurrent.futures.TimeoutError:
                    raise StoreError(f"the reader's processes gave no row group of {store.url_for(files[seg.file])} "
                                     f"within {timeout:.0f} s (set {ENV_READER_TIMEOUT} to wait longer)") from None
                except (StoreError, DataError):
                    raise
                except Exception as exc:
                    raise StoreError(f"cannot read row group {seg.row_group} of {store.url_for(files[seg.file])} in "
                                     f"a reader process: {type(exc).__name__}: {exc}") from exc
        finally:
            for _, future in pending:
                future.cancel()

    def close(self) -> None:
        """End the worker processes."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


_SHARED: dict[str, ProcessPool] = {}


def shared(start_method: str | None = None) -> ProcessPool:
    """The process-wide pool of ``start_method`` (created once, ended at exit).

    Raises:
        ConfigError: an unknown start method.
    """
    pool = ProcessPool(DEFAULT_PROCESSES, start_method)
    return _SHARED.setdefault(pool.start_method, pool)


@atexit.register
def _close_all() -> None:
    for pool in list(_SHARED.values()):
        pool.close()
    _SHARED.clear()


__all__ = ["ProcessPool", "shared", "START_METHODS", "DEFAULT_PROCESSES"]
