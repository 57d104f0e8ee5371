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

:class:`DeviceFeed` is the device side of the feed: on a CUDA rank (and in ``use_gpu=True``
transform) a feed thread makes each batch's tensors, puts them in pinned memory and copies them
to the device with ``non_blocking=True`` on a side stream, one batch ahead of the step, whose
stream waits on the copy's event (the host never waits for a copy). On the CPU nothing changes:
the tensors are made in the calling thread, as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from hora.errors import StoreError

logger = logging.getLogger(__name__)

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

    import hora.native as hn

    slots = np.zeros(size, dtype=np.float64)
    slots[rank] = fraction
    if size > 1:
        slots = np.asarray(hn.allreduce(slots, op=hn.Sum, name="hora.estimators.data_wait"), dtype=np.float64)
    return [float(v) for v in slots]


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


class Fed(NamedTuple):
    """One batch from :class:`DeviceFeed`: its tensors on the device (in the order the maker gave
    them; None stays None) and what else the maker returned with them, as it was."""

    tensors: list[Any]
    extra: Any


#: seconds the step waits for the feed thread beyond the reader's own timeout
_FEED_MARGIN_S = 30.0


class DeviceFeed:
    """A pass of batches made tensors on ``device``: ``batches(source, make)`` yields :class:`Fed`.

    ``make(batch) -> (tensors, extra)`` makes a batch's tensors on the CPU (a list; None entries
    allowed). On a CUDA device (or with ``threaded=True``) a feed thread runs ``make`` on each
    batch of ``source`` (the reader's batches, a ``transformation_fn`` on them included), pins the
    dense tensors (``pin_memory``) and issues their copies with ``non_blocking=True`` on a side
    stream, recording an event, while the step trains on the batch before: ``ahead`` batches are
    ready or in flight. The step's stream waits on the event (``wait_event``: the host does not
    wait), and each tensor is marked as used by that stream (``record_stream``) so the allocator
    does not hand its memory out while the step runs. On the CPU ``make`` runs in the calling
    thread and the tensors are given as made.

    Raises (while iterating):
        whatever ``source`` or ``make`` raised (in the feed thread, raised here);
        StoreError: no batch from the feed thread within the reader's timeout and a margin.
    """

    def __init__(self, device: Any, ahead: int = 1, threaded: bool | None = None, name: str = "feed") -> None:
        import torch

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.threaded = self.cuda if threaded is None else bool(threaded)
        self.ahead = max(1, int(ahead))
        self.name = name
        self._stream: Any = None

    def batches(self, source: Iterable[Any], make: Callable[[Any], tuple[list[Any], Any]]) -> Iterator[Fed]:
        """The batches of ``source`` as :class:`Fed` (see the class docstring)."""
        if not self.threaded:
            for batch in source:
                tensors, extra = make(batch)
                yield Fed(self._moved_here(tensors), extra)
            return
        yield from self._threaded(source, make)

    def _moved_here(self, tensors: list[Any]) -> list[Any]:
        """The CPU path: tensors already on the device stay; others are moved (a blocking copy)."""
        if self.device.type == "cpu":
            return tensors
        return [t if t is None or t.device == self.device else t.to(self.device) for t in tensors]

    # the feed thread ---------------------------------------------------------------------
    def _stage(self, tensors: list[Any]) -> tuple[list[Any], Any]:
        """Pin and copy ``tensors`` to the device on the side stream; the copies' event (None off CUDA)."""
        import torch

        if not self.cuda:
            return self._moved_here(tensors), None
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        out = []
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            for t in tensors:
                if t is None or t.device == self.device:
                    out.append(t)
                    continue
                if t.layout == torch.strided and not t.is_pinned():
                    t = t.pin_memory()
                out.append(t.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def _ready(self, tensors: list[Any], event: Any) -> list[Any]:
        """In the step's thread: its stream waits for the copies; the tensors are marked as its."""
        if event is None:
            return tensors
        import torch

        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for t in tensors:
            if t is not None and t.device == self.device:
                t.record_stream(stream)
        return tensors

    def _threaded(self, source: Iterable[Any], make: Callable[[Any], tuple[list[Any], Any]]) -> Iterator[Fed]:
        from hora.store.background import Tracker, in_background
        from hora.store.reader import reader_timeout

        def staged() -> Iterator[tuple[list[Any], Any, Any]]:
            it = iter(source)
            try:
                for batch in it:
                    tensors, extra = make(batch)
                    yield (*self._stage(list(tensors)), extra)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

        name = self.name

        class _Log(Tracker):
            def joined(self, thread: Any, stop: Any, alive: bool) -> None:
                if alive:
                    logger.debug("%s: the device feed thread is still finishing its batch", name)

        limit = reader_timeout() + _FEED_MARGIN_S
        for staged_tensors, event, extra in in_background(
                staged, maxsize=self.ahead, name=f"hora-device-feed-{name}", timeout=limit, tracker=_Log(),
                silent=lambda t: StoreError(f"{name}: no batch from the device feed thread within {t:.0f} s "
                                            f"(the reader's timeout and {_FEED_MARGIN_S:.0f} s)"),
                ended=lambda: StoreError(f"{name}: the device feed thread ended without a batch")):
            yield Fed(self._ready(staged_tensors, event), extra)

__all__ = ["DataWait", "DeviceFeed", "Fed", "WARN_ABOVE", "advice", "gathered", "summary_note"]
