"""An iterator produced in a daemon thread, ahead of its consumer, through a bounded queue.

The reader's row-group and batch prefetch and the estimators' device feed all read ahead this way:
the producer runs ``make_iter()`` in its own thread (the iterator is made there, so its setup
overlaps too), an exception in the producer is raised in the consumer, closing the consumer's
generator stops the producer within a poll, and a consumer never waits forever: no item within
``timeout`` seconds, or a producer that ended without its end mark, is the caller's error.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

#: How often a blocked producer or consumer looks at the stop flag and the other side's health.
POLL_S = 0.5


class Tracker:
    """What a caller does with each producer thread: :meth:`started` before it runs, :meth:`joined`
    after the consumer has stopped it (``alive``: it is still finishing its item)."""

    def started(self, thread: threading.Thread, stop: threading.Event) -> None:
        """Before the producer starts (e.g. keep it where an ``atexit`` hook can stop it)."""

    def joined(self, thread: threading.Thread, stop: threading.Event, alive: bool) -> None:
        """After the consumer stopped and joined the producer (for a bounded wait)."""


def in_background(
    make_iter: Callable[[], Any],
    *,
    maxsize: int,
    name: str,
    timeout: float,
    silent: Callable[[float], BaseException],
    ended: Callable[[], BaseException],
    tracker: Tracker | None = None,
) -> Iterator[Any]:
    """The items of ``make_iter()``, produced in a daemon thread named ``name``, at most ``maxsize`` ahead.

    Raises:
        The producer's exception, where the consumer is; ``silent(timeout)`` when no item comes
        within ``timeout`` seconds; ``ended()`` when the producer thread died without an end mark.
    """
    q: queue.Queue = queue.Queue(maxsize=max(1, maxsize))
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = None
        try:
            source = make_iter()
            for item in source:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # raised where the consumer is
            put(exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    if tracker is not None:
        tracker.started(thread, stop)
    thread.start()
    try:
        while True:
            waited = 0.0
            while True:
                try:
                    item = q.get(timeout=POLL_S)
                    break
                except queue.Empty:
                    waited += POLL_S
                    if not thread.is_alive() and q.empty():
                        raise ended() from None
                    if waited >= timeout:
                        raise silent(timeout) from None
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=5 * POLL_S)
        if tracker is not None:
            tracker.joined(thread, stop, thread.is_alive())


__all__ = ["POLL_S", "Tracker", "in_background"]
