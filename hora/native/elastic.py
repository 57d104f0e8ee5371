"""Elastic training state and the retry loop, framework-neutral (Horovod's ``horovod.common.elastic``).

A :class:`State` holds what a training loop must not lose: it is ``commit``-ed to memory
now and then, ``restore``-d to the last commit after a failure, and ``sync``-ed from rank
0 when training (re)starts. :func:`run_fn` turns a training function into one that
survives a collective failure (Horovod's semantics)::

    while True:
        try:
            state.sync()                  # every rank from rank 0's state
            return func(state, ...)
        except HorovodInternalError:      # a collective failed (hora: CollectiveError)
            state.restore()               # back to the last commit
        except HostsUpdatedInterrupt:     # the set of hosts changed (commit/check_host_updates)
            pass                          # the state is current: no restore
        reset()                           # shutdown + init: a new generation of the job
        state.on_reset()                  # the reset callbacks (rescale the learning rate...)

A rank whose collective fails resets; its shutdown tells the other ranks at once (their
collectives that need it fail too), so they reset with it and every rank meets in the
job's next generation (see :func:`hora.native.init`).

hora jobs have a fixed set of ranks today: :meth:`State.check_host_updates` raises only
when something called :meth:`State.on_hosts_updated`. The loop, the state's sync and the
reset live here, once, so a membership change (ranks joining and leaving) plugs into
``reset`` and ``on_hosts_updated`` without touching the frameworks' states.

``HORA_ELASTIC_RESET_LIMIT`` (default 5): the most resets in a row without a commit in
between; then the last error is raised (an error that recurs at every retry is a bug, not
a transient failure, and retrying it forever would hang the job).
"""

from __future__ import annotations

import copy
import functools
import logging
import queue
from collections.abc import Callable
from typing import Any

from hora import settings
from hora.errors import ConfigError, HorovodInternalError, HostsUpdatedInterrupt

log = logging.getLogger(__name__)

ENV_RESET_LIMIT = "HORA_ELASTIC_RESET_LIMIT"
DEFAULT_RESET_LIMIT = settings.default(ENV_RESET_LIMIT)


def reset_limit() -> int:
    """``HORA_ELASTIC_RESET_LIMIT`` (default 5; 0: no limit).

    Raises:
        ConfigError: not a non-negative integer.
    """
    return settings.get(ENV_RESET_LIMIT)


class State:
    """State kept in sync across ranks and restored after failures (Horovod's ``State``).

    Args:
        bcast_object: ``(obj) -> obj`` broadcasting a picklable object from rank 0.
        get_rank: ``() -> int``, this process's rank.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[float, int]] = queue.Queue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], None]] = []
        self.commits = 0  # commits so far (the retry loop counts resets without progress)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset, before the state is synchronized again
        (e.g. to rescale the learning rate with the new number of ranks)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by the retry loop after a reset: :meth:`reset`, then the callbacks."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Record that the job's hosts changed at ``timestamp`` (``update_res``: 1 added,
        2 removed, 3 both); the next :meth:`check_host_updates` raises."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state to memory (what :meth:`restore` returns to), then check for host
        updates (raising :class:`~hora.errors.HostsUpdatedInterrupt` when there are)."""
        self.save()
        self.commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`~hora.errors.HostsUpdatedInterrupt` on every rank alike when an
        update was recorded on any of them since the last check. A collective (rank 0's
        view is broadcast), so every rank must call it at the same point.

        Raises:
            HostsUpdatedInterrupt: hosts were updated (``skip_sync`` when only removed).
        """
        last = prev = self._last_updated_timestamp
        update = 0
        while not self._host_messages.empty():
            timestamp, res = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= res
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, last, update))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(update == 2)

    def save(self) -> None:
        """Save the state to memory."""
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    def restore(self) -> None:
        """Return to the last saved state, undoing what changed since."""
        raise NotImplementedError(f"{type(self).__name__} must implement restore()")

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        raise NotImplementedError(f"{type(self).__name__} must implement sync()")

    def reset(self) -> None:
        """Hook run after a reset, before the callbacks (subclasses: rebuild what depends
        on the ranks, e.g. a sampler's partition)."""


class ObjectState(State):
    """Picklable attributes, given as keyword arguments (``epoch=0, batch=0``), kept in
    sync across ranks (Horovod's ``ObjectState``)."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state = {k: copy.deepcopy(v) for k, v in kwargs.items()}
        for k, v in kwargs.items():
            setattr(self, k, v)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self) -> None:
        """Every rank takes rank 0's values of the attributes (and saves them)."""
        if self._saved_state:
            values = self._bcast_object({k: getattr(self, k) for k in self._saved_state})
            for k, v in values.items():
                setattr(self, k, v)
            self.save()


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Wrap ``func(state, *args, **kwargs)`` in the elastic retry loop (module docstring).

    ``reset`` re-forms the job (the frameworks pass their ``shutdown(); init()``).

    Raises (from the wrapper):
        HorovodInternalError: more than ``HORA_ELASTIC_RESET_LIMIT`` resets in a row
            without a commit in between (the last error, with a note).
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise ConfigError(f"{getattr(func, '__name__', func)!r} is wrapped by elastic.run: its first argument "
                              f"must be an elastic State (TorchState, ObjectState), got {type(state).__name__}")
        limit = reset_limit()
        skip_sync = False
        resets, commits_at_reset = 0, state.commits
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                if state.commits != commits_at_reset:
                    resets = 0
                resets += 1
                if limit and resets > limit:
                    raise HorovodInternalError(
                        f"elastic.run: gave up after {limit} resets in a row without a commit in between "
                        f"({ENV_RESET_LIMIT}); the last error: {exc}") from exc
                log.warning("elastic.run: a collective failed (%s); restoring the last commit and resetting "
                            "(%d in a row)", exc, resets)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                log.info("elastic.run: hosts were updated; resetting")
                skip_sync = exc.skip_sync
            commits_at_reset = state.commits
            reset()
            state.on_reset()

    return wrapper


__all__ = ["State", "ObjectState", "run_fn", "reset_limit", "ENV_RESET_LIMIT"]
