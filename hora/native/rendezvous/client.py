"""The rendezvous client: :class:`KVClient` (a rank's connection to the server) and
:func:`barrier` (every rank meets at a named key set)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from hora import settings
from hora.errors import ConfigError, RendezvousError
from hora.native.rendezvous.contract import ENV_RENDEZVOUS_TIMEOUT
from hora.native.rendezvous.protocol import PeerClosedError, recv_frame, send_frame
from hora.native.rendezvous import tls

log = logging.getLogger("hora.native.rendezvous")


class KVClient:
    """A worker's connection to the :class:`RendezvousServer` (thread-safe).

    Values are bytes. Every wait has a timeout (default ``HORA_RENDEZVOUS_TIMEOUT`` or
    60 s) and raises :class:`~hora.errors.RendezvousError` naming the missing keys.
    """

    def __init__(self, addr: str, secret: bytes, timeout: float | None = None) -> None:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"rendezvous address {addr!r} is not host:port")
        self._addr = (host.strip("[]"), int(port))
        self._secret = secret
        self.timeout = timeout if timeout is not None else settings.get(ENV_RENDEZVOUS_TIMEOUT)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        """The server's (host, port)."""
        return self._addr

    @property
    def secret(self) -> bytes:
        """The job secret the frames are signed with."""
        return self._secret

    def with_timeout(self, timeout: float) -> KVClient:
        """A new client of the same server whose connects and calls give up after ``timeout``
        seconds (its own connection, so a slow call of this one never blocks the other)."""
        return KVClient(f"{self._addr[0]}:{self._addr[1]}", self._secret, timeout=timeout)

    def _connect(self, deadline: float) -> socket.socket:
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                # TLS to the job's pinned certificate when the job uses it; a failed handshake
                # raises RendezvousError at once (no retry helps)
                return tls.connect(self._addr, self._secret, max(0.1, min(5.0, deadline - time.monotonic())))
            except OSError as exc:
                last = exc
                time.sleep(0.1)
        raise RendezvousError(f"cannot reach the rendezvous server at {self._addr[0]}:{self._addr[1]}: {last}")

    def _call(self, request: tuple, wait_timeout: float = 0.0) -> Any:
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._sock = self._connect(time.monotonic() + self.timeout)
                sock = self._sock
                try:
                    sock.settimeout(wait_timeout + 30.0)
                    send_frame(sock, self._secret, request)
                    status, value = recv_frame(sock, self._secret)
                    break
                except (ConnectionError, socket.timeout, OSError) as exc:
                    self.close_locked()
                    if attempt == 1 or request[0] in ("add", "batch"):  # not idempotent
                        raise RendezvousError(f"lost the rendezvous server at {self._addr[0]}:{self._addr[1]}: "
                                              f"{exc}{self._plain_hint(exc)}") from exc
        if status == "error":
            raise RendezvousError(value)
        return value

    def _plain_hint(self, exc: BaseException) -> str:
        """Why a server may close a connection at once: it wants TLS and this client has none."""
        if isinstance(exc, (PeerClosedError, ConnectionResetError)) and tls.for_secret(self._secret) is None:
            return " (a server of a run with TLS closes plaintext connections: is this run's TLS on?)"
        return ""

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (bytes) under ``key``."""
        self._call(("set", key, bytes(value)))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Wait for ``key`` and return its value. Raises RendezvousError on timeout."""
        return self.wait([key], timeout)[0]

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> list[bytes]:
        """Wait for all ``keys``; return their values in order. Raises RendezvousError naming the missing ones."""
        t = self.timeout if timeout is None else timeout
        return self._call(("wait", list(keys), t), wait_timeout=t)

    def watch(self, keys: Iterable[str], timeout: float) -> list[bytes] | None:
        """Wait up to ``timeout`` s for all ``keys``: their values, or None at the timeout (a
        pushed signal: the server answers the moment the last key is written)."""
        return self._call(("watch", list(keys), timeout), wait_timeout=timeout)

    def batch(self, requests: list[tuple]) -> list[Any]:
        """Several writes (``("set", key, value)``, ``("add", key, n)``, ``("delete", key)``) in
        one request, applied in order; their results. Not retried on a lost connection."""
        return self._call(("batch", list(requests)))

    def post(self, requests: list[tuple]) -> None:
        """Send writes as :meth:`batch` does, without waiting for (or getting) an answer: a
        heartbeat costs the server one read. Raises RendezvousError when it cannot be sent
        (the connection is dropped; the next call connects again); never retried."""
        with self._lock:
            if self._sock is None:
                self._sock = self._connect(time.monotonic() + self.timeout)
            try:
                self._sock.settimeout(30.0)
                send_frame(self._sock, self._secret, ("post", list(requests)))
            except OSError as exc:
                self.close_locked()
                host, port = self._addr
                raise RendezvousError(f"lost the rendezvous server at {host}:{port}: {exc}") from exc

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (0 if absent); return the new value."""
        return self._call(("add", key, amount))

    def delete(self, key: str) -> bool:
        return self._call(("delete", key))

    def keys(self, prefix: str = "") -> list[str]:
        return self._call(("keys", prefix))

    def ping(self) -> bool:
        return self._call(("ping",)) == "pong"


def barrier(client: KVClient, name: str, rank: int, size: int, timeout: float, *, what: str = "rank") -> None:
    """Meet every rank at the barrier ``name``.

    Raises:
        RendezvousError: naming the ranks that did not arrive within ``timeout`` seconds.
    """
    client.set(f"barrier/{name}/{rank}", b"1")
    keys = [f"barrier/{name}/{r}" for r in range(size)]
    try:
        client.wait(keys, timeout)
    except RendezvousError:
        present = set(client.keys(f"barrier/{name}/"))
        missing = [r for r, k in enumerate(keys) if k not in present]
        raise RendezvousError(
            f"{what}(s) {missing} never arrived at rendezvous '{name}' within {timeout:g}s "
            f"({size - len(missing)} of {size} arrived)"
        ) from None


__all__ = ["KVClient", "barrier"]
