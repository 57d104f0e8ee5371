"""What a rank and its task supervisor send to, and hear from, the driver service.

* :class:`Beater`: a rank's heartbeat, with the latest metrics of :func:`hora.runners.report`
  riding on it (one request per beat, never one more per report; one frame per beat for all
  the ranks of a host, through :mod:`hora.runners.rank.relay`).
* :class:`AbortWatch`: the driver's abort, pushed. The watch parks a ``watch`` request on
  ``runner/abort`` over its own connection; the driver's event loop answers it the moment
  the abort is set (no polling; an idle rank sends one request per :data:`WATCH_PERIOD`).
  The same connection tells when the driver is gone: a driver killed by SIGKILL has its
  sockets closed by the kernel, so the watch reads end-of-file at once and, when no
  connection can be made again within :data:`RECONNECT_S`, reports the driver lost within
  seconds. A driver cut off without closing (a network partition) sends nothing at all:
  that is still seen after ``HORA_HEARTBEAT_TIMEOUT`` of silence (:attr:`AbortWatch.last_contact`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable

from hora.errors import HoraError, RendezvousError
from hora.native import keys
from hora.native.rendezvous import tls
from hora.native.rendezvous import KVClient
from hora.native.rendezvous.protocol import FrameError, recv_frame, send_frame
from hora.runners.rank.relay import NO_RELAY, SENT, HostBeats

log = logging.getLogger(__name__)

#: seconds one abort watch stays parked at the driver before it is asked again
WATCH_PERIOD = 10.0
#: seconds a watch whose connection the driver closed tries to connect again before the
#: driver counts as gone
RECONNECT_S = 3.0
#: seconds past the period a parked watch waits for its answer before the driver counts as silent
REPLY_SLACK = 5.0


def parked_for(period: float) -> float:
    """Seconds one watch of ``period`` stays parked: 75-100% of it, drawn anew each time, so the
    watches of thousands of ranks started together do not all come back to the driver at once."""
    return period * random.uniform(0.75, 1.0)


class Beater:
    """A rank's heartbeat (``runner/hb/<r>``), carrying the metrics reported since the last one.

    With ``relay`` (:class:`~hora.runners.rank.relay.HostBeats`) the beat goes to the host's relay
    rank, which posts the beats of all the host's ranks in one frame (or this rank is the relay);
    without one, or when the relay cannot take it, the beat is posted to the driver directly.
    """

    def __init__(self, client: KVClient, rank: int, relay: HostBeats | None = None) -> None:
        self.client = client
        self.rank = rank
        self.relay = relay
        self._lock = threading.Lock()
        self._metrics: bytes | None = None

    def metrics(self, payload: bytes) -> None:
        """Send ``payload`` (the pickled ``(seq, metrics)`` of ``runner/metrics/<r>``) with the next beat."""
        with self._lock:
            self._metrics = payload

    def beat(self) -> None:
        """One heartbeat (and the pending metrics), sent without waiting for an answer.

        Raises:
            RendezvousError: it could not be sent (the metrics are kept for the next beat).
        """
        with self._lock:
            payload, self._metrics = self._metrics, None
        relay = self.relay
        if relay is not None and not relay.is_relay:
            sent = relay.offer(self.rank, payload)
            if sent == SENT:
                return
            if sent == NO_RELAY:
                relay.claim()
        writes: list[tuple] = [("add", keys.rank_key(keys.HEARTBEAT, self.rank), 1)]
        if payload is not None:
            writes.append(("set", keys.rank_key(keys.METRICS, self.rank), payload))
        if relay is not None and relay.is_relay:
            writes += relay.take()  # the host's other ranks' beats, in the same frame
        try:
            self.client.post(writes)  # one-way: the driver's silence is the abort watch's to judge
        except HoraError:
            if payload is not None:
                with self._lock:
                    self._metrics = self._metrics or payload
            raise

    def flush(self) -> None:
        """Send pending metrics now (the rank ends), and the beats this rank still holds as its
        host's relay (which it stops being); errors are logged."""
        with self._lock:
            payload, self._metrics = self._metrics, None
        writes: list[tuple] = [] if self.relay is None else self.relay.release()
        if payload is not None:
            writes.append(("set", keys.rank_key(keys.METRICS, self.rank), payload))
        if writes:
            try:
                self.client.batch(writes)
            except HoraError as exc:
                log.warning("rank %d: could not send its last metrics to the driver: %s", self.rank, exc)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        self.client.close()


class AbortWatch(threading.Thread):
    """Hears the driver's abort the moment it is set, and a driver that closed its connections.

    Args:
        client: the rank's (or supervisor's) client: its address and secret (the watch opens
            its own connection).
        on_abort: called once when the driver aborts the run.
        on_lost: called once with a reason when the driver closed the connection and cannot
            be reached again within :data:`RECONNECT_S` (it is gone).
        name: names the thread.
        period: seconds a watch stays parked before it is renewed.
        lost_after: seconds without an answer, once asking fails (no answer within ``period`` +
            :data:`REPLY_SLACK`, or no connection), after which the driver counts as lost (a
            driver cut off without closing); a slow answer is no failure.
    """

    def __init__(self, client: KVClient, on_abort: Callable[[], None], on_lost: Callable[[str], None], *,
                 name: str = "", period: float = WATCH_PERIOD, lost_after: float | None = None) -> None:
        super().__init__(name=f"hora-abort-watch-{name}", daemon=True)
        self._addr = client.address
        self._secret = client.secret
        self.on_abort = on_abort
        self.on_lost = on_lost
        self.period = period
        self.lost_after = lost_after
        self.last_contact = time.monotonic()  # the last answer (or connect) of the driver
        self.lost: str | None = None
        self.aborted = False
        self.reconnecting = False  # the driver closed the connection; trying it again
        self.failing = False  # the last ask got no answer (no connection, or none in time)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def settle(self, timeout: float = RECONNECT_S + 1.0) -> None:
        """Wait (up to ``timeout`` s) while the watch is finding out whether a driver that closed
        its connection is gone (:attr:`lost`) or took a new one."""
        deadline = time.monotonic() + timeout
        while self.reconnecting and self.lost is None and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop watching; no callback runs after this returns (one under way finishes first)."""
        with self._lock:
            self._stopped.set()
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _fire(self, callback: Callable[..., None], *args: str) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            callback(*args)

    def _connect(self, timeout: float) -> socket.socket | None:
        """A new connection, retried for ``timeout`` s; None when the driver refuses or is unreachable."""
        deadline = time.monotonic() + timeout
        while not self._stopped.is_set():
            try:
                # TLS to the job's pinned certificate when the run uses it (hora.native.rendezvous.tls)
                return tls.connect(self._addr, self._secret, max(0.1, deadline - time.monotonic()))
            except (OSError, RendezvousError):  # a failed TLS handshake counts as a refusal
                if time.monotonic() >= deadline:
                    return None
                self._stopped.wait(0.2)
        return None

    def _silent(self) -> bool:
        """After a failed ask: whether the driver has not answered for ``lost_after`` s (then lost)."""
        if self.lost_after is None or time.monotonic() - self.last_contact <= self.lost_after:
            return False
        self.lost = "silent"
        self._fire(self.on_lost, f"no answer for {self.lost_after:g} s")
        return True

    def run(self) -> None:
        try:
            self._watch()
        finally:
            sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()

    def _watch(self) -> None:
        closed = False  # the driver closed our connection: reconnect now, or it is gone
        while not self._stopped.is_set():
            if self._sock is None:
                sock = self._connect(RECONNECT_S if closed else self.period)
                if sock is None:
                    self.failing = True
                    if closed:
                        self.lost = "closed"
                        self.reconnecting = False
                        self._fire(self.on_lost, "the driver closed its connection and refuses new ones")
                        return
                    if self._silent():
                        return
                    continue
                with self._lock:
                    if self._stopped.is_set():
                        sock.close()
                        return
                    self._sock = sock
                closed = self.reconnecting = False  # (a connect is no contact: a stopped process's kernel accepts it)
            sock = self._sock
            try:
                sock.settimeout(self.period + REPLY_SLACK)
                send_frame(sock, self._secret, ("watch", [keys.ABORT], parked_for(self.period)))
                status, value = recv_frame(sock, self._secret)
            except (ConnectionError, FrameError, OSError) as exc:
                timed_out = isinstance(exc, TimeoutError)
                with contextlib.suppress(OSError):
                    sock.close()
                self._sock = None
                closed = self.reconnecting = not timed_out
                self.failing = True
                if not self._stopped.is_set():
                    log.debug("abort watch %s: %s", self.name, exc)
                if timed_out and self._silent():
                    return
                continue
            self.last_contact = time.monotonic()
            self.failing = False
            if status != "ok":
                log.warning("abort watch %s: the driver answered %s", self.name, value)
                self._stopped.wait(1.0)
                continue
            if value is not None:
                self.aborted = True
                self._fire(self.on_abort)
                return


__all__ = ["AbortWatch", "Beater", "WATCH_PERIOD", "RECONNECT_S", "parked_for"]
