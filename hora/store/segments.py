"""Which rows each rank reads in an epoch: the split's row groups in one order (shuffled per epoch with
``(seed, epoch)``, the same on every rank), cut into equal contiguous ranges (see :mod:`hora.store.reader`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hora.errors import DataError


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of row group ``row_group`` of file ``file`` (an index into the split's files)."""

    file: int
    row_group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan_segments(
    group_rows: Sequence[tuple[int, int, int]],
    rank: int,
    size: int,
    epoch: int,
    seed: int,
    shuffle: bool,
    remainder: str = "pad",
) -> tuple[list[Segment], int]:
    """The row-group slices rank ``rank`` reads in ``epoch``, and its row count (equal on all ranks).

    Args:
        group_rows: ``(file, row_group, rows)`` of every row group of the split, in file order.

    Raises:
        DataError: the split has no rows, or (``truncate``) fewer rows than ranks.
    """
    groups = [g for g in group_rows if g[2] > 0]
    total = sum(g[2] for g in groups)
    if total == 0:
        raise DataError("the split has no rows to read")
    if shuffle:
        order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(groups))
        groups = [groups[i] for i in order]
    if remainder == "truncate":
        per = total // size
        if per == 0:
            raise DataError(f"the split has {total} rows, fewer than the {size} ranks (remainder='truncate')")
    else:
        per = -(-total // size)
    begin = (rank * per) % total
    segments: list[Segment] = []
    need = per
    # walk the (cyclic) row sequence from `begin`
    starts = np.cumsum([0] + [g[2] for g in groups])
    idx = int(np.searchsorted(starts, begin, side="right") - 1)
    offset = begin - int(starts[idx])
    while need > 0:
        f, rg, rows = groups[idx]
        take = min(rows - offset, need)
        segments.append(Segment(f, rg, offset, offset + take))
        need -= take
        offset = 0
        idx = (idx + 1) % len(groups)
    return segments, per


__all__ = ["Segment", "plan_segments"]
