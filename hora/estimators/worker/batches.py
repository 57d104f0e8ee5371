"""This rank's batches: one pass of the store reader per epoch (or from memory), as the session makes them.

:func:`rank_batches` drives the reader for the worker loop (and for frameworks that run
their own loop, through :class:`hora.estimators.worker.loop.WorkerRun`): it checks that the
session's ``batches`` hook keeps every rank at the same number of steps. With
``inmemory_cache_all``, :class:`CachedReader` serves later epochs from memory.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Callable, Iterator

import numpy as np

from hora.errors import DataError
from hora.estimators.data.columns import column_ops
from hora.estimators.framework import TrainingSession
from hora.store.reader import ROW_ID, Reader, row_position

logger = logging.getLogger(__name__)


#: glibc's malloc thresholds in a training rank (:func:`steady_allocator`): the most glibc's own
#: dynamic rule reaches (its DEFAULT_MMAP_THRESHOLD_MAX on 64 bits, and twice that for trimming)
RANK_MMAP_THRESHOLD = 32 << 20
RANK_TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
#: the user's own glibc malloc settings, which :func:`steady_allocator` leaves alone
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_allocator: list[bool] = []  # [whether steady_allocator set the thresholds], once per process


def steady_allocator() -> bool:
    """Set glibc's malloc thresholds for a training rank, once per process: blocks up to
    :data:`RANK_MMAP_THRESHOLD` come from the heap, and freed memory goes back to the system
    only past :data:`RANK_TRIM_THRESHOLD` free at the top of the heap. Whether it set them.

    Left to itself, glibc raises its mmap threshold to the largest block freed so far, and trims
    the heap past twice that. A rank whose largest freed block is a step's biggest activation (a
    small CNN on batches of decoded 28x28 images: 3.2 MB) then gives the step's ~9 MB of
    activations back to the system at every step and takes them again, page by page: ~2,300
    page faults a step, a step of ~11 ms instead of ~5 (measured on 2 cores). A rank that
    happened to free a bigger block first (reading a column of decoded arrays) never does, so
    the same model ran at 0.6x on PNG bytes for no reason of its own. Not on other C libraries,
    nor when the user set glibc's ``MALLOC_*_`` variables or ``glibc.malloc`` tunables.
    """
    if _allocator:
        return _allocator[0]
    tuned = False
    user = any(k in os.environ for k in _MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a name this platform knows: not glibc
        libc = ""
    if libc.startswith("glibc") and not user:
        try:
            mallopt = ctypes.CDLL(None).mallopt
            tuned = bool(mallopt(_M_MMAP_THRESHOLD, RANK_MMAP_THRESHOLD)) and bool(
                mallopt(_M_TRIM_THRESHOLD, RANK_TRIM_THRESHOLD))
        except (OSError, AttributeError) as exc:  # pragma: no cover - glibc without mallopt
            logger.debug("mallopt is not available (%s): glibc's malloc thresholds left as they are", exc)
    if tuned:
        logger.debug("glibc malloc: mmap threshold %d MiB, trim threshold %d MiB for training",
                     RANK_MMAP_THRESHOLD >> 20, RANK_TRIM_THRESHOLD >> 20)
    _allocator.append(tuned)
    return tuned


def _reader_ops(spec: Any, reader: Reader) -> Callable | None:
    """The column operations of a rank's reader (its batches' specs; rows named by the reader's files)."""
    from hora.estimators.spec import thaw

    common = thaw(spec.common) if spec.common else {}
    ops = column_ops(spec.config, {c: reader.specs[c] for c in reader.columns if c in reader.specs},
                     common.get("decode_fn"), common.get("collate_fn"), where=lambda i: row_position(reader, i))
    if ops is None and reader.row_ids:
        return _without_row_ids
    return ops


def _without_row_ids(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {c: a for c, a in batch.items() if c != ROW_ID}


class CachedReader(Reader):
    """A :class:`~hora.store.Reader` that keeps its rank's rows after the first pass (``inmemory_cache_all``).

    The first pass reads and keeps what the wrapped reader yields; later passes
    (:meth:`set_epoch` for the next epoch) serve the same rows from memory, in a new
    seeded order when shuffling, in as many batches as the first pass (the same on
    every rank, as the reader guarantees). With a :class:`~hora.store.ColumnOps` as the
    reader's ``batch_fn``, its row-wise part (decoding images) runs once, in the first
    pass's prefetch thread, and the decoded rows are kept (``rows x H x W x C`` bytes of
    memory for images); its batch-wise part (padding, sparse batches, ``collate_fn``) runs
    on each pass's batches.
    """

    def __init__(self, reader: Reader) -> None:  # shares the reader's plan; reads nothing yet
        self.__dict__.update(reader.__dict__)
        self._source = reader
        fn = reader.batch_fn
        rows, batches = getattr(fn, "decode_rows", None), getattr(fn, "finish", None)
        if rows is not None and batches is not None:
            #: the row-wise part, in the source's prefetch thread; the kept rows are its output
            reader.batch_fn, self._fn = rows, batches
        else:
            #: the reader's batch_fn, applied to the kept rows on each pass
            self._fn, reader.batch_fn = fn, None
        self._cache: dict[str, np.ndarray] | None = None
        self._sizes: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if getattr(self, "_cache", None) is None and hasattr(self, "_source"):
            self._source.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._sizes) if self._cache is not None else len(self._source)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._cache is None:
            parts: list[dict[str, np.ndarray]] = []
            for batch in self._source:
                parts.append(batch)
                yield batch if self._fn is None else self._fn(batch)
            if len(parts) == len(self._source):  # a whole pass: keep it
                try:  # (where rows are stored is of no use once they are kept: errors come in this first pass)
                    self._cache = ({c: np.concatenate([p[c] for p in parts]) for c in parts[0] if c != ROW_ID}
                                   if parts else {})
                except ValueError as exc:  # e.g. a decode_fn whose shape differs between batches
                    logger.warning("inmemory_cache_all: rank %d's batches do not join into one array per column "
                                   "(%s); each epoch reads and decodes them again", self.rank, exc)
                    return
                self._sizes = [len(next(iter(p.values()))) for p in parts]
            return
        rows = sum(self._sizes)
        order = np.arange(rows)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch, self.rank, 0xCA]).permutation(rows)
        start = 0
        for n in self._sizes:
            idx = order[start:start + n]
            start += n
            batch = {c: a.take(idx, axis=0) for c, a in self._cache.items()}
            yield batch if self._fn is None else self._fn(batch)


def reader_layout(spec: Any) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """The batch columns and feature groups a reader gives when it stacks the groups itself:
    every stored column but a group's members (unless they are labels or the weight too),
    and each group under its key."""
    groups = dict(spec.features.groups)
    needed = {*spec.config.label_cols, *([spec.config.sample_weight_col] if spec.config.sample_weight_col else [])}
    members = {m for cols in groups.values() for m in cols} - needed
    return [c for c in spec.dataset.columns if c not in members] + list(groups), groups


def rank_batches(
    spec: Any, session: TrainingSession, transform: Callable | None, split: str, rank: int, size: int, epoch: int,
    steps: int | None, cache: dict[str, CachedReader] | None = None, skip: int = 0, stack_groups: bool = False,
) -> Iterator[Any]:
    """This rank's batches of ``split`` for ``epoch``, as the session's ``batches`` hook makes them
    from each reader pass; with ``steps`` larger than one pass, further passes (differently
    shuffled) follow until ``steps`` batches were given. ``cache`` (a dict kept across epochs)
    holds the in-memory readers; ``skip`` batches are passed over (a resumed epoch).
    ``stack_groups``: the reader stacks the feature groups (:func:`reader_layout`; only
    without a ``transformation_fn``, which sees the members). The process's allocator is set
    for training first (:func:`steady_allocator`).

    Raises:
        DataError: the hook gave a different number of batches than the reader holds
            (ranks would fall out of step in their collectives).
    """
    from hora.store import make_reader

    steady_allocator()
    config = spec.config
    train = split == "train"
    columns, groups = reader_layout(spec) if stack_groups and spec.features.groups else (None, None)
    given = sub = 0
    while True:
        pass_epoch = epoch * 1000 + sub
        reader = cache.get(split) if cache is not None else None
        if reader is None:
            reader = make_reader(spec.store, spec.dataset, split=split, rank=rank, size=size,
                                 batch_size=config.batch_size if train else config.val_batch, epoch=pass_epoch,
                                 seed=config.seed, shuffle=config.shuffle and train,
                                 shuffle_buffer_size=config.shuffle_buffer_size, columns=columns, groups=groups,
                                 row_ids=any(not s.is_dense for s in spec.dataset.columns.values()))
            reader.batch_fn = _reader_ops(spec, reader)  # decoding, padding: in the reader's prefetch thread
            if getattr(config, "reader_pool_type", None) == "process":  # Horovod's: row groups read in processes
                from hora.store.process_reader import shared

                reader.read_pool = shared(config.mp_start_method)
            if cache is not None:
                reader = cache[split] = CachedReader(reader)
        else:
            reader.set_epoch(pass_epoch)
        expected = len(reader)
        if expected == 0:
            return
        in_pass = 0
        for batch in session.batches(reader, transform):
            if steps is not None and given >= steps:
                return
            in_pass += 1
            if in_pass > expected:
                break
            if given < skip:
                given += 1
                continue
            yield batch
            given += 1
        if in_pass != expected:
            got = f"more than {expected}" if in_pass > expected else str(in_pass)
            raise DataError(
                f"rank {rank}: {type(session).__name__}.batches gave {got} batches for one pass of the {split!r} "
                f"reader, which holds {expected} (every rank must step the same number of times)"
            )
        sub += 1
        if steps is None or given >= steps or not train:
            return


def steps_per_epoch(spec: Any, split: str, rank: int, size: int) -> int:
    """Batches of ``split`` in one epoch on this rank (the progress bar's total, a loop's step count)."""
    from hora.store import make_reader

    config = spec.config
    train = split == "train"
    one_pass = len(make_reader(spec.store, spec.dataset, split=split, rank=rank, size=size,
                               batch_size=config.batch_size if train else config.val_batch, epoch=0, seed=config.seed,
                               shuffle=False))
    if train:
        return config.train_steps_per_epoch or one_pass
    return min(one_pass, config.validation_steps_per_epoch or one_pass)


__all__ = ["CachedReader", "rank_batches", "reader_layout", "steps_per_epoch", "steady_allocator"]
