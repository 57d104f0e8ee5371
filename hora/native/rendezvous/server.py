"""The rendezvous server: an authenticated key-value store the launcher runs for its ranks.

It keeps a table of keys (set, add, delete, list by prefix, wait for keys) and serves
it over signed frames (:mod:`.protocol`); a connection that fails the check, or sends
anything malformed, is logged and dropped. The server never crashes because of a peer.
"""

from __future__ import annotations

import logging
import pickle
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous.protocol import FRAME_TIMEOUT, FrameError, recv_frame, send_frame

log = logging.getLogger("hora.native.rendezvous")


class _Table:
    """The key-value table with blocking waits; shared by the server's handler threads."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def delete(self, key: str) -> bool:
        with self._cond:
            return self._data.pop(key, None) is not None

    def keys(self, prefix: str) -> list[str]:
        with self._cond:
            return sorted(k for k in self._data if k.startswith(prefix))

    def wait(self, keys: Sequence[str], timeout: float) -> list[bytes] | list[str]:
        """Values of ``keys``; on timeout, raise RendezvousError naming the missing keys."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return [self._data[k] for k in keys]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousError(
                        f"timed out after {timeout:g}s waiting for key(s) {', '.join(missing)}"
                    )
                self._cond.wait(min(left, 1.0))


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        peer = "%s:%s" % self.client_address[:2]
        secret = self.server.secret
        table = self.server.table
        while not self.server.closing:
            try:
                request = recv_frame(sock, secret, FRAME_TIMEOUT)
            except ConnectionError:
                return
            except (FrameError, pickle.UnpicklingError, EOFError, struct.error) as exc:
                log.warning("rendezvous: dropping connection from %s: %s", peer, exc)
                return
            except OSError:
                return
            except Exception as exc:  # garbage that passed HMAC cannot happen; be safe anyway
                log.warning("rendezvous: dropping connection from %s: unreadable frame (%s)", peer, exc)
                return
            try:
                reply = ("ok", self._dispatch(table, request))
            except RendezvousError as exc:
                reply = ("error", str(exc))
            except Exception as exc:
                log.warning("rendezvous: bad request from %s: %r", peer, exc)
                reply = ("error", f"bad request: {exc!r}")
            try:
                send_frame(sock, secret, reply)
            except OSError:
                return

    @staticmethod
    def _dispatch(table: _Table, request: Any) -> Any:
        if not isinstance(request, tuple) or not request or not isinstance(request[0], str):
            raise ValueError("request is not an (op, ...) tuple")
        op, args = request[0], request[1:]
        if op == "set":
            key, value = args
            table.set(str(key), bytes(value))
            return None
        if op == "wait":
            keys, timeout = args
            return table.wait([str(k) for k in keys], float(timeout))
        if op == "add":
            key, amount = args
            return table.add(str(key), int(amount))
        if op == "delete":
            return table.delete(str(args[0]))
        if op == "keys":
            return table.keys(str(args[0]))
        if op == "ping":
            return "pong"
        raise ValueError(f"unknown op {op!r}")


#: how often the serving thread looks for :meth:`RendezvousServer.stop`'s request between
#: connections: ``stop`` (at the end of every run) waits up to this long (it was 0.2 s: a
#: tenth of a second or more at the end of every ``hora run``, fit and test job); an idle
#: wake-up is one ``select`` call (0.1 % of a core at 20 a second)
SHUTDOWN_POLL_S = 0.05


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], secret: bytes, table: _Table) -> None:
        self.secret = secret
        self.table = table
        self.closing = False
        super().__init__(addr, _Handler)


class RendezvousServer:
    """An authenticated key-value store served over TCP from a background thread.

    The launcher owns it: :meth:`start` binds (port 0 picks a free port, so there is no
    race), the launcher passes ``f"{host}:{port}"`` to workers, and :meth:`stop` closes it.
    The launcher itself can use :meth:`set`, :meth:`wait` and :meth:`keys` directly.
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0) -> None:
        if not secret:
            raise ConfigError("the rendezvous secret must not be empty")
        self._secret = secret
        self._bind = (host, port)
        self._table = _Table()
        self._server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on. Raises RendezvousError if not started."""
        if self._server is None:
            raise RendezvousError("rendezvous server is not started")
        host, port = self._server.server_address[:2]
        return host, port

    @property
    def addr(self) -> str:
        """``"host:port"`` as workers expect it in ``HORA_RENDEZVOUS_ADDR``."""
        host, port = self.address
        return f"{host}:{port}"

    def start(self) -> tuple[str, int]:
        """Bind and serve in a daemon thread; returns (host, port)."""
        if self._server is not None:
            return self.address
        self._server = _TCPServer(self._bind, self._secret, self._table)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, name="hora-rendezvous",
            daemon=True,
        )
        self._thread.start()
        log.debug("rendezvous server listening on %s", self.addr)
        return self.address

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.closing = True
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RendezvousServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # direct (in-process) access for the launcher
    def set(self, key: str, value: bytes) -> None:
        self._table.set(key, value)

    def wait(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        return self._table.wait(list(keys), timeout)  # type: ignore[return-value]

    def keys(self, prefix: str = "") -> list[str]:
        return self._table.keys(prefix)


__all__ = ["RendezvousServer"]
