"""Heartbeats batched per host: the ranks of one run on one host beat through one of them.

A driver with thousands of ranks pays a read and a frame for every heartbeat; an 8-GPU host
sending its ranks' beats as one frame costs it an eighth of that. Where several ranks of a run
share a host (a Spark executor's tasks, a Dask worker's threads, ``hora run``'s local or ssh
ranks), the first rank whose beat finds no relay becomes the host's *relay*: it binds a Linux
abstract datagram socket whose name is derived from the job's secret, run id, attempt and
driver address (nobody without the secret can find or squat it). The other ranks' watchdogs send
their beats (with the metrics riding on them) to it as datagrams signed with the job's secret,
and the relay posts them with its own beat, in one one-way frame of the same writes each rank
would have posted itself (``add runner/hb/<r>``, ``set runner/metrics/<r>``): the wire protocol
and the driver's bookkeeping per rank are unchanged.

A rank's beat is relayed only when its own watchdog sent it: a rank whose watchdog stops (its
process killed, stopped or stuck) sends nothing, its key stops moving, and the driver reports
it lost as before. A relay that is gone (its socket closed with its process) refuses the next
datagram, and the sender posts its beat itself and takes the relay's place; a relay that is
stuck has not read the datagram a sender sent a period before (the kernel tells the sender),
and the senders post their beats themselves until it reads again.
Beats older than two periods when the relay gets to them are dropped (a relay that was
stopped and resumed does not vouch for ranks that may have died meanwhile).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import hmac
import logging
import pickle
import socket
import struct
import sys
import termios
import threading
import time
from typing import Any

from hora.native import keys
from hora.native.rendezvous.protocol import HEADER, MAGIC, sign

log = logging.getLogger(__name__)

#: the largest datagram a rank sends to its relay (a beat with bigger metrics goes to the driver itself)
MAX_DATAGRAM = 60 * 1024
#: what :meth:`HostBeats.offer` tells its caller
SENT, NO_RELAY, BUSY = "sent", "no relay", "busy"
_ZERO = struct.pack("i", 0)


def relay_name(secret: bytes, run_id: str, attempt: int, driver_addr: str) -> bytes:
    """The abstract socket address of the relay of ``run_id``'s ``attempt`` on this host."""
    digest = hmac.new(secret, f"beats\0{run_id}\0{attempt}\0{driver_addr}".encode(), hashlib.sha256).hexdigest()
    return b"\0hora-beats-" + digest[:32].encode()


def supported() -> bool:
    """Whether this platform has abstract unix sockets (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class HostBeats:
    """One rank's side of its host's heartbeat relay: it sends its beats to the relay, or is it.

    Args:
        secret: the job's secret (signs the datagrams).
        name: the relay's abstract address (:func:`relay_name`).
        interval: seconds between two beats of a rank (older beats are not relayed).
    """

    def __init__(self, secret: bytes, name: bytes, interval: float) -> None:
        self.secret = secret
        self.name = name
        self.interval = interval
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[float, bytes | None]] = {}  # rank -> (when, metrics)
        self.relayed = 0  # other ranks' beats this rank posted (while it was the relay)
        self.offered = 0  # beats of this rank that went through another rank

    def _unread(self) -> bool:
        """Whether the last datagram this rank sent is still in the relay's queue: a relay that
        has not read a beat in a whole period is stuck (stopped, or starved): beat around it.
        (For a unix socket the kernel's ``SIOCOUTQ`` counts the bytes sent and not yet read.)"""
        try:
            return struct.unpack("i", fcntl.ioctl(self._out.fileno(), termios.TIOCOUTQ, _ZERO))[0] > 0
        except OSError:
            return False

    @property
    def is_relay(self) -> bool:
        """Whether this rank is its host's relay now."""
        return self._server is not None

    def offer(self, rank: int, metrics: bytes | None) -> str:
        """Send rank ``rank``'s beat (and ``metrics``) to the host's relay.

        Returns:
            :data:`SENT`; :data:`NO_RELAY` (nobody is the relay: the caller may claim it); or
            :data:`BUSY` (a relay that does not keep up, or metrics too big: the caller posts itself).
        """
        body = pickle.dumps((rank, time.monotonic(), metrics), protocol=pickle.HIGHEST_PROTOCOL)
        if len(body) > MAX_DATAGRAM or self._unread():
            return BUSY
        try:
            self._out.sendto(HEADER.pack(MAGIC, len(body), sign(self.secret, body)) + body, self.name)
        except (ConnectionRefusedError, FileNotFoundError):
            return NO_RELAY
        except OSError as exc:  # EAGAIN: the relay's queue is full (it is stuck); anything else: post
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                log.debug("heartbeat relay: %s", exc)
            return BUSY
        self.offered += 1
        return SENT

    def claim(self) -> bool:
        """Become the host's relay if nobody is; whether this rank is it now."""
        if self._server is not None:
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.name)
        except OSError:  # another rank took it first
            sock.close()
            return False
        sock.settimeout(0.5)
        self._server = sock
        self._thread = threading.Thread(target=self._receive, args=(sock,), name="hora-beat-relay", daemon=True)
        self._thread.start()
        log.debug("heartbeat relay: this rank relays its host's beats")
        return True

    def _receive(self, sock: socket.socket) -> None:
        while self._server is sock:
            try:
                data = sock.recv(MAX_DATAGRAM + HEADER.size)
            except TimeoutError:
                continue
            except OSError:  # closed by release()
                return
            if not data:  # shut down by release()
                continue
            beat = self._open(data)
            if beat is None:
                continue
            rank, at, metrics = beat
            with self._lock:
                old = self._pending.get(rank)
                if metrics is None and old is not None:
                    metrics = old[1]  # metrics not yet posted stay until the next frame
                self._pending[rank] = (at, metrics)

    def _open(self, data: bytes) -> tuple[int, float, bytes | None] | None:
        """The beat in a datagram, or None for one that is not a signed beat of this job."""
        if len(data) < HEADER.size:
            return None
        magic, length, mac = HEADER.unpack_from(data)
        body = data[HEADER.size:]
        if magic != MAGIC or length != len(body) or not hmac.compare_digest(mac, sign(self.secret, body)):
            log.debug("heartbeat relay: dropped a datagram that is not a signed beat of this job")
            return None
        try:
            rank, at, metrics = pickle.loads(body)  # only after the HMAC check
            return int(rank), float(at), (None if metrics is None else bytes(metrics))
        except Exception:  # noqa: BLE001 - signed but malformed: dropped
            return None

    def take(self) -> list[tuple[str, str, Any]]:
        """The writes of the other ranks' beats received since the last call (the relay's side)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return []
        oldest = time.monotonic() - 2 * self.interval
        writes: list[tuple[str, str, Any]] = []
        for rank, (at, metrics) in pending.items():
            if at < oldest:
                continue
            writes.append(("add", keys.rank_key(keys.HEARTBEAT, rank), 1))
            if metrics is not None:
                writes.append(("set", keys.rank_key(keys.METRICS, rank), metrics))
            self.relayed += 1
        return writes

    def release(self) -> list[tuple[str, str, Any]]:
        """Stop relaying (the rank ends): the writes still to post. Beats sent after this are
        refused and their ranks post them themselves (and one of them takes over)."""
        sock, self._server = self._server, None
        if sock is not None:
            # an empty datagram to itself wakes the receiving thread at once (a shutdown() of a unix
            # datagram socket does not interrupt its recv: the thread would sleep out its 0.5 s timeout,
            # and every rank's end with it)
            with contextlib.suppress(OSError):
                self._out.sendto(b"", self.name)
            if self._thread is not None:
                self._thread.join(timeout=1.0)
            sock.close()
        return self.take()

    def close(self) -> None:
        """Release the relay and close this rank's socket."""
        self.release()
        with contextlib.suppress(OSError):
            self._out.close()


def for_rank(secret: bytes, run_id: str, attempt: int, driver_addr: str, interval: float) -> HostBeats | None:
    """The host relay of a rank of ``run_id``, or None where it is off (``HORA_HOST_BEATS=0``) or
    not supported (not Linux)."""
    from hora import settings

    if not supported() or not settings.get("HORA_HOST_BEATS"):
        return None
    return HostBeats(secret, relay_name(secret, run_id, attempt, driver_addr), interval)


__all__ = ["HostBeats", "for_rank", "relay_name", "supported", "SENT", "NO_RELAY", "BUSY", "MAX_DATAGRAM"]
