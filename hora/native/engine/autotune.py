"""Autotuning of the fusion threshold and the cycle time (``HORA_AUTOTUNE=1``).

The autotuner only *proposes*: rank 0 scores each candidate (threshold, cycle time) by
bytes reduced per second over ``HORA_AUTOTUNE_WINDOW`` rounds that did work, moves to
the next candidate, and finally keeps the best and logs it. Rank 0's current candidate
travels in every round's control vector, and every rank applies the job-wide value to
its :class:`~.config.Tuning` before executing that round (:meth:`Autotuner.proposal`),
so all ranks always group tensors with the same threshold. The configuration itself is
never changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from hora.native.engine.cache import Response
from hora.native.engine.request import itemsize, numel_of

log = logging.getLogger(__name__)

THRESHOLDS = (1 << 20, 4 << 20, 16 << 20, 64 << 20)  # bytes
CYCLES = (0.0005, 0.001, 0.0025, 0.005)  # seconds


class Autotuner:
    """Rank 0's search over :data:`THRESHOLDS` x :data:`CYCLES` (every rank has one: the
    others only translate the job-wide candidate index into values)."""

    def __init__(self, window: int, clock: object = time.perf_counter) -> None:
        self.candidates = [(t, c) for t in THRESHOLDS for c in CYCLES]
        self.window = window
        self.index = 0  # rank 0's current candidate (what it proposes)
        self.applied = -1  # the job-wide candidate last applied
        self.scores: list[float] = []
        self.window_rounds = 0
        self.window_bytes = 0
        self._clock = clock
        self.window_start = clock()  # type: ignore[operator]
        self.done = False

    def proposal(self, index: int) -> tuple[int, float] | None:
        """The (fusion threshold, cycle time) to apply for the job-wide candidate
        ``index``, or None when it is already applied or is not a candidate."""
        if index == self.applied or not 0 <= index < len(self.candidates):
            return None
        self.applied = index
        return self.candidates[index]

    def observe(self, responses: Iterable[Response]) -> None:
        """Score a round that ran ``responses`` (rank 0)."""
        responses = list(responses)
        if self.done or not responses:
            return
        self.window_rounds += 1
        self.window_bytes += sum(numel_of(r.key.shape) * itemsize(r.key.dtype)
                                 for r in responses if r.key and r.key.dtype and r.error is None)
        if self.window_rounds < self.window:
            return
        now = self._clock()  # type: ignore[operator]
        elapsed = max(now - self.window_start, 1e-9)
        self.scores.append(self.window_bytes / elapsed)
        self.window_rounds = 0
        self.window_bytes = 0
        if len(self.scores) >= len(self.candidates):
            best = max(range(len(self.scores)), key=self.scores.__getitem__)
            self.index = best
            self.done = True
            t, c = self.candidates[best]
            log.info("autotune: chose fusion threshold %d bytes and cycle time %.2f ms (%.1f MB/s)",
                     t, c * 1000, self.scores[best] / 1e6)
        else:
            self.index = len(self.scores)
        self.window_start = self._clock()  # type: ignore[operator]
