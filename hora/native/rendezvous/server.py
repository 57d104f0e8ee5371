"""The rendezvous server: an authenticated key-value store the launcher runs for its ranks.

It keeps a table of keys (set, add, delete, list by prefix, wait for keys; :mod:`.table`)
and serves it over signed frames (:mod:`.protocol`) from one event loop: one thread, one
``selectors`` selector, every connection non-blocking. A request is answered inline (the
table's operations never block); a ``wait`` whose keys are missing parks the connection on
those keys, and the write that completes them sends the answer. Thousands of ranks cost
thousands of sockets, not thousands of threads.

A connection that fails the HMAC check, or sends anything malformed, is logged (once per
address and kind) and dropped; a frame begun must be complete within ``FRAME_TIMEOUT``;
a connection that never sends a signed frame is closed after ``FRAME_TIMEOUT``, and at most
:data:`~hora.native.rendezvous.loop.MAX_UNSIGNED_PER_HOST` of those are held per address (a flood of silent connections
is refused at the door, never a thread each). The server never crashes because of a peer.

Requests (tuples, after the HMAC check): ``("set", key, value)``, ``("add", key, n)``,
``("delete", key)``, ``("keys", prefix)``, ``("wait", keys, timeout)`` (an error naming the
missing keys at the timeout), ``("watch", keys, timeout)`` (None at the timeout: a pushed
signal such as the abort), ``("batch", [request, ...])`` (several writes in one frame: a
process that speaks for several ranks), ``("post", [request, ...])`` (a batch never answered:
heartbeats cost the server one read, no write), ``("ping",)``.
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from collections.abc import Sequence

from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous.loop import SHUTDOWN_POLL_S, _Loop
from hora.native.rendezvous.table import Table
from hora.native.rendezvous.tls import JobCertificate, for_secret, server_context

log = logging.getLogger("hora.native.rendezvous")


def _raise_fd_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit (a driver of thousands
    of ranks holds a socket per connection); best effort."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


class RendezvousServer:
    """An authenticated key-value store served over TCP from a background event loop.

    The launcher owns it: :meth:`start` binds (port 0 picks a free port, so there is no
    race), the launcher passes ``f"{host}:{port}"`` to workers, and :meth:`stop` closes it.
    The launcher itself can use :meth:`set`, :meth:`wait`, :meth:`keys` and
    :meth:`changes` directly.
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0,
                 tls: JobCertificate | None = None) -> None:
        if not secret:
            raise ConfigError("the rendezvous secret must not be empty")
        self._secret = secret
        # TLS: the certificate given, else the one this job's secret is filed under (hora.native.rendezvous.tls)
        self._tls = tls if tls is not None else for_secret(secret)
        if self._tls is not None:
            server_context(self._tls)  # a certificate without its key fails here, not in the loop
        self._bind = (host, port)
        self._table = Table()
        self._loop: _Loop | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on. Raises RendezvousError if not started."""
        if self._sock is None:
            raise RendezvousError("rendezvous server is not started")
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def addr(self) -> str:
        """``"host:port"`` as workers expect it in ``HORA_RENDEZVOUS_ADDR``."""
        host, port = self.address
        return f"{host}:{port}"

    def start(self) -> tuple[str, int]:
        """Bind and serve from a daemon thread; returns (host, port)."""
        if self._sock is not None:
            return self.address
        _raise_fd_limit()
        family = socket.AF_INET6 if ":" in self._bind[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self._bind)
            sock.listen(socket.SOMAXCONN)  # thousands of ranks connect at once
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._loop = _Loop(sock, self._secret, self._table,
                           server_context(self._tls) if self._tls is not None else None)
        self._thread = threading.Thread(target=self._loop.run, name="hora-rendezvous", daemon=True)
        self._thread.start()
        log.debug("rendezvous server listening on %s%s", self.addr, " (TLS)" if self._tls is not None else "")
        return self.address

    def stop(self) -> None:
        """Stop serving and close every connection and the socket (idempotent)."""
        loop, sock, self._loop, self._sock = self._loop, self._sock, None, None
        if loop is None:
            return
        loop.closing = True
        loop.post(lambda: None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if sock is not None:
            sock.close()

    def __enter__(self) -> RendezvousServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def tls(self) -> JobCertificate | None:
        """The certificate the server presents (None: plaintext)."""
        return self._tls

    @property
    def last_turn(self) -> float:
        """``time.monotonic()`` when the event loop last finished a turn (a loop stuck in a
        slow request leaves it behind; readers of heartbeats measure silence against it)."""
        loop = self._loop
        return loop.last_turn if loop is not None else time.monotonic()

    # direct (in-process) access for the launcher
    def set(self, key: str, value: bytes) -> None:
        self._table.set(key, value)

    def add(self, key: str, amount: int = 1) -> int:
        return self._table.add(key, amount)

    def wait(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        return self._table.wait(list(keys), timeout)

    def keys(self, prefix: str = "") -> list[str]:
        return self._table.keys(prefix)

    def delete(self, key: str) -> bool:
        return self._table.delete(key)

    def changes(self, since: int) -> tuple[int, list[tuple[str, bytes | None]]]:
        """What was written or deleted after sequence number ``since`` (:meth:`Table.changes`)."""
        return self._table.changes(since)


__all__ = ["RendezvousServer", "SHUTDOWN_POLL_S"]
