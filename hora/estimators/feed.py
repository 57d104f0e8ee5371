"""How long a rank's training step waited for its batches (``data_wait``), and what to do about it.

:class:`DataWait` is the rank's clock. The worker wraps each training pass in
:meth:`DataWait.timed` (every framework's batches go through it: the shared loop's,
Keras's ``tf.data`` pipeline's, Lightning's on the DataFrame); a framework that reads its
own data (Lightning with a ``data_module``) reports the gaps between its steps instead
(:meth:`DataWait.step_begins` / :meth:`DataWait.step_ends`). :meth:`DataWait.fraction`
is the part of the epoch's training wall time (from the first request for a batch to the
end of the last step) spent waiting for the next batch: 0 when the reader always had one
ready, near 1 when the step mostly waited.

The worker gathers every rank's fraction once per epoch: the history, the progress bar,
TensorBoard and the callbacks (MLflow) get the largest (``data_wait``); rank 0's result
holds each rank's (``data_wait_by_rank``), which the fit's summary line shows. After the
first epoch over :data:`WARN_ABOVE`, rank 0 logs one warning naming the likely cause and
the knobs (:func:`advice`).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator, Sequence

#: an epoch whose data wait (the largest over the ranks) is over this gets one warning per fit
WARN_ABOVE = 0.2


class DataWait:
    """One rank's data-wait clock, one epoch at a time (see the module docstring)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.waited = 0.0  # seconds waiting for batches that came
        self.first = 0.0  # the first of them: the reader's start (planning, opening files, the first batch)
        self.batches = 0
        self._start: float | None = None  # the first request for a batch of the epoch
        self._last: float | None = None  # the end of the latest step (or request) seen
        self._step_end: float | None = None  # gap mode: the end of the previous step

    def begin(self, epoch: int) -> None:
        """Start counting ``epoch`` (a new epoch resets; the same epoch again keeps counting)."""
        if epoch == self.epoch:
            return
        self.epoch, self.waited, self.first, self.batches = epoch, 0.0, 0.0, 0
        self._start = self._last = self._step_end = None

    def _waited(self, seconds: float) -> None:
        if not self.batches:
            self.first = seconds
        self.waited += seconds
        self.batches += 1

    def timed(self, batches: Iterable[Any], epoch: int) -> Iterator[Any]:
        """``batches`` as they come, the time spent waiting in each ``next()`` counted for ``epoch``.

        The request that finds the pass exhausted is not a wait for a batch (its end is the
        end of the last step).
        """
        clock = time.perf_counter
        self.begin(epoch)
        it = iter(batches)
        while True:
            asked = clock()
            if self._start is None:
                self._start = asked
            self._last = asked
            try:
                batch = next(it)
            except StopIteration:
                return
            self._waited(clock() - asked)
            yield batch

    def epoch_starts(self, epoch: int) -> None:
        """Gap mode: ``epoch``'s training starts now (its first batch is waited for from here)."""
        self.begin(epoch)
        if self._start is None:
            self._start = self._last = time.perf_counter()

    def step_begins(self) -> None:
        """Gap mode (a framework's own data loading): a step starts; the time since the previous
        step ended (or the epoch started) was spent getting its batch."""
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        self._waited(now - (self._step_end if self._step_end is not None else self._start))
        self._last = now

    def step_ends(self) -> None:
        """A training step ended (both modes: the epoch's training wall time runs to the last one)."""
        now = time.perf_counter()
        self._last = self._step_end = now

    def fraction(self) -> float:
        """The part of the epoch's training wall time spent waiting for batches (0.0 when nothing was timed)."""
        if self._start is None or self._last is None:
            return 0.0
        wall = self._last - self._start
        return min(1.0, self.waited / wall) if wall > 0 else 0.0


def gathered(fraction: float, rank: int, size: int) -> list[float]:
    """Every rank's ``fraction`` of this epoch, on every rank (one small sum-allreduce: each
    rank fills its own slot). Call it on every rank, once per epoch."""
    import numpy as np

    from hora.estimators.worker import allreduce_sum

    slots = np.zeros(size, dtype=np.float64)
    slots[rank] = fraction
    return [float(v) for v in allreduce_sum(slots)]


def advice(per_rank: Sequence[float], epoch: int, decoding: Sequence[str], cached: bool, batch_size: int,
           use_gpu: bool, transforming: bool = False) -> str:
    """The warning after an epoch whose data wait is over :data:`WARN_ABOVE`: the rank that waited
    most, the likely cause and the knobs, most likely first.

    Args:
        per_rank: each rank's fraction of the epoch.
        epoch: the epoch (0-based).
        decoding: the feature columns decoded on the ranks (binary columns: ``decode_fn`` or the
            default image decoding).
        cached: ``inmemory_cache_all`` is on.
        batch_size: rows per batch.
        use_gpu: the ranks train on GPUs.
        transforming: a ``transformation_fn`` runs on each batch (in the training thread).
    """
    worst = max(range(len(per_rank)), key=lambda r: per_rank[r])
    head = (f"rank {worst} waited for its next batch {per_rank[worst]:.0%} of epoch {epoch + 1}'s training time "
            f"(data_wait={per_rank[worst]:.2f}): its reader does not keep up with the step. ")
    knobs = []
    if decoding:
        cols = ", ".join(repr(c) for c in decoding)
        knobs.append(f"decoding {cols} in the reader's prefetch thread is the likely cause: make decode_fn cheaper "
                     "(decode to the model's size, or store decoded arrays)")
    if transforming:
        knobs.append("transformation_fn runs on every batch in the training thread, and counts as waiting: keep "
                     "it light, or do its work once, before fit")
    if not cached:
        knobs.append("inmemory_cache_all=True reads (and decodes) each rank's rows once and serves later epochs "
                     "from memory")
    if not use_gpu:
        knobs.append("the reader's threads share the rank's cores with torch: fewer torch threads per rank "
                     "(HORA_RANK_THREADS) or fewer ranks per host leave them a core")
    knobs.append(f"a larger batch_size (now {batch_size}) takes fewer hand-overs and steps for the same rows")
    return head + "; ".join(knobs) + "."


def summary_note(by_rank: Sequence[dict[str, Any]] | None) -> str:
    """``"; data_wait max 0.62 (rank 1, epoch 2), last epoch by rank: 0.31, 0.62"`` for the fit's
    summary line ('' without figures)."""
    if not by_rank:
        return ""
    epoch, rank, value = max(((e["epoch"], r, v) for e in by_rank for r, v in enumerate(e["ranks"])),
                             key=lambda t: t[2])
    last = ", ".join(f"{v:.2f}" for v in by_rank[-1]["ranks"])
    return f"; data_wait max {value:.2f} (rank {rank}, epoch {epoch + 1}), last epoch by rank: {last}"


__all__ = ["DataWait", "WARN_ABOVE", "advice", "gathered", "summary_note"]
