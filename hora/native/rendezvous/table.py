"""The rendezvous server's key-value table: values, per-key waiters and a change log.

A write wakes only the waiters of the key it wrote (a waiter on several keys counts down
its missing keys). Every write and delete takes the next number of one sequence, so a
reader can ask for what changed since its last look (:meth:`Table.changes`) instead of
reading every key again. The table is shared by the server's event loop and the launcher's
own thread (direct calls), under one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from hora.errors import RendezvousError


class Waiter:
    """Someone waiting for every one of ``keys``: ``fire(values)`` runs once all are set
    (under the table's lock: it must only hand the values on)."""

    __slots__ = ("keys", "missing", "fire", "done")

    def __init__(self, keys: Sequence[str], fire: Callable[[list[bytes]], None]) -> None:
        self.keys = list(keys)
        self.missing = 0
        self.fire = fire
        self.done = False


class Table:
    """Keys to bytes, with per-key waiters and a change sequence (thread-safe)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._waiters: dict[str, list[Waiter]] = {}
        self._order: OrderedDict[str, int] = OrderedDict()  # key -> seq of its last change, oldest first
        self.seq = 0
        self.lock = threading.Lock()

    # writes ------------------------------------------------------------------------------
    def _changed(self, key: str) -> None:
        self.seq += 1
        order = self._order
        order[key] = self.seq
        order.move_to_end(key)

    def _wake(self, key: str) -> None:
        waiters = self._waiters.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            if w.done:
                continue
            w.missing -= 1
            if w.missing == 0:
                values = self.get_locked(w.keys)
                if values is None:  # a key it had seen was deleted since: wait for it again
                    self.add_waiter_locked(w)
                    continue
                w.done = True
                w.fire(values)

    def set(self, key: str, value: bytes) -> None:
        with self.lock:
            self.set_locked(key, value)

    def set_locked(self, key: str, value: bytes) -> None:
        """:meth:`set` for a caller that holds :attr:`lock`."""
        new = key not in self._data
        self._data[key] = value
        self._changed(key)
        if new:
            self._wake(key)

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            return self.add_locked(key, amount)

    def add_locked(self, key: str, amount: int) -> int:
        """:meth:`add` for a caller that holds :attr:`lock`."""
        old = self._data.get(key)
        value = int(old or b"0") + amount
        self._data[key] = str(value).encode()
        self._changed(key)
        if old is None:
            self._wake(key)
        return value

    def delete(self, key: str) -> bool:
        with self.lock:
            return self.delete_locked(key)

    def delete_locked(self, key: str) -> bool:
        if self._data.pop(key, None) is None:
            return False
        self._changed(key)
        return True

    # reads -------------------------------------------------------------------------------
    def keys(self, prefix: str) -> list[str]:
        with self.lock:
            return self.keys_locked(prefix)

    def keys_locked(self, prefix: str) -> list[str]:
        return sorted(k for k in self._data if k.startswith(prefix))

    def get_locked(self, keys: Sequence[str]) -> list[bytes] | None:
        """The values of ``keys`` if all are set, else None."""
        data = self._data
        try:
            return [data[k] for k in keys]
        except KeyError:
            return None

    def changes(self, since: int) -> tuple[int, list[tuple[str, bytes | None]]]:
        """``(seq, [(key, value or None if deleted), ...])``: the keys written or deleted after
        sequence number ``since`` (each once, oldest change first) and the current number."""
        out: list[tuple[str, bytes | None]] = []
        with self.lock:
            data = self._data
            for key, seq in reversed(self._order.items()):
                if seq <= since:
                    break
                out.append((key, data.get(key)))
            if len(self._order) > 2 * max(1024, len(data)):  # forget deleted keys seen long ago
                self._order = OrderedDict((k, s) for k, s in self._order.items() if k in data)
            return self.seq, out[::-1]

    # waits -------------------------------------------------------------------------------
    def add_waiter_locked(self, waiter: Waiter) -> bool:
        """Register ``waiter`` on its missing keys; False (nothing registered) if none is missing."""
        data = self._data
        missing = [k for k in set(waiter.keys) if k not in data]
        if not missing:
            return False
        waiter.missing = len(missing)
        for k in missing:
            self._waiters.setdefault(k, []).append(waiter)
        return True

    def cancel_locked(self, waiter: Waiter) -> list[str]:
        """Withdraw a waiter that has not fired; return the keys it still missed."""
        waiter.done = True
        missing = [k for k in dict.fromkeys(waiter.keys) if k not in self._data]
        for k in missing:
            lst = self._waiters.get(k)
            if lst is not None:
                try:
                    lst.remove(waiter)
                except ValueError:
                    pass
                if not lst:
                    del self._waiters[k]
        return missing

    def wait(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        """Values of ``keys`` (blocking the calling thread, not the server's loop).

        Raises:
            RendezvousError: naming the keys still missing after ``timeout`` seconds.
        """
        box: list[list[bytes]] = []
        ready = threading.Event()

        def fire(values: list[bytes]) -> None:
            box.append(values)
            ready.set()

        waiter = Waiter(keys, fire)
        with self.lock:
            values = self.get_locked(waiter.keys)
            if values is not None:
                return values
            self.add_waiter_locked(waiter)
        if ready.wait(max(0.0, timeout)):
            return box[0]
        with self.lock:
            if box:
                return box[0]
            missing = self.cancel_locked(waiter)
        raise timeout_error(timeout, missing)


def timeout_error(timeout: float, missing: Sequence[str]) -> RendezvousError:
    return RendezvousError(f"timed out after {timeout:g}s waiting for key(s) {', '.join(missing)}")


__all__ = ["Table", "Waiter", "timeout_error"]
