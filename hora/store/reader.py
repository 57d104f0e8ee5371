"""Per-rank streaming reader of a materialized dataset: sharding, shuffling, prefetch.

See :func:`make_reader`.
"""

from __future__ import annotations

import logging
from typing import Iterator, Sequence

import numpy as np

from hora.store.dataset import DatasetInfo
from hora.store.store import Store

logger = logging.getLogger(__name__)


class Reader:
    """Iterates the batches of one rank for one epoch (see :func:`make_reader`)."""

    def __len__(self) -> int:
        raise NotImplementedError("hora.store.Reader is being implemented (issue 4)")

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError("hora.store.Reader is being implemented (issue 4)")


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
) -> Reader:
    """A reader of rank ``rank``'s share of ``split`` for one epoch.

    Every rank yields exactly ``len(reader)`` batches, the same number on all ranks.

    Args:
        store, info: the Store and the DatasetInfo from :func:`hora.store.materialize`.
        split: ``"train"`` or ``"val"``.
        rank, size: this rank and the number of ranks.
        batch_size: rows per batch (the last batch of an epoch may be smaller unless drop_last).
        epoch, seed: the shuffle of each epoch is seeded by (seed, epoch), identical on all ranks.
        shuffle: shuffle row-group order and rows (through the shuffle buffer).
        shuffle_buffer_size: rows mixed together in memory (default 100,000).
        columns: columns to read (default: all stored columns).
        prefetch: batches prepared ahead by a background thread (0: no thread).
        remainder: when rows do not divide by ``size``: ``"pad"`` re-reads a few rows
            so every row is seen, ``"truncate"`` drops the last rows of the shuffled order.
        drop_last: drop each rank's last partial batch.

    Returns:
        a :class:`Reader`; ``for batch in reader`` gives ``dict[str, np.ndarray]`` with
        shapes ``(rows, *ColumnSpec.shape)``.

    Raises:
        ConfigError: bad rank/size/batch_size/split/columns.
        DataError: the split is empty.
    """
    raise NotImplementedError("hora.store.make_reader is being implemented (issue 4)")


__all__ = ["Reader", "make_reader"]
