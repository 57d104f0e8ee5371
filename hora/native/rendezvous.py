"""Rendezvous: the environment contract and an authenticated key-value store.

A launcher (``hora run``, the Spark, Dask or local runner) starts a
:class:`RendezvousServer` and gives every worker its place in the job through
``HORA_*`` environment variables (see :class:`WorkerEnv`). Workers talk to the server
with a :class:`KVClient` to exchange addresses and to meet at barriers.

Every frame on the wire, in both directions, is ``MAGIC | length | HMAC-SHA256 | body``.
The HMAC is computed with the job's secret over the body and is checked *before* the
body is unpickled; a connection that fails the check, or sends anything malformed, is
logged and dropped. The server never crashes because of a peer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import pickle
import secrets
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hora import settings
from hora.errors import ConfigError, RendezvousError
from hora.settings import ENV_BACKEND  # gloo | nccl | mpi | auto (default auto)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# The environment contract
# ---------------------------------------------------------------------------------------
ENV_RANK = "HORA_RANK"
ENV_SIZE = "HORA_SIZE"
ENV_LOCAL_RANK = "HORA_LOCAL_RANK"
ENV_LOCAL_SIZE = "HORA_LOCAL_SIZE"
ENV_CROSS_RANK = "HORA_CROSS_RANK"
ENV_CROSS_SIZE = "HORA_CROSS_SIZE"
ENV_RENDEZVOUS_ADDR = "HORA_RENDEZVOUS_ADDR"  # "host:port" of the RendezvousServer
ENV_SECRET = "HORA_SECRET"  # hex of the per-job secret
ENV_JOB_ID = "HORA_JOB_ID"
ENV_HOSTNAME = "HORA_HOSTNAME"  # address this worker advertises to its peers (gloo, ...)
ENV_START_TIMEOUT = "HORA_START_TIMEOUT"  # seconds to wait for every rank at start
ENV_RENDEZVOUS_TIMEOUT = "HORA_RENDEZVOUS_TIMEOUT"  # seconds for one key-value wait

DEFAULT_START_TIMEOUT = settings.default(ENV_START_TIMEOUT)
DEFAULT_RENDEZVOUS_TIMEOUT = settings.default(ENV_RENDEZVOUS_TIMEOUT)

_MAGIC = b"HORA"
_HEADER = struct.Struct("!4sI32s")
_MAX_FRAME = 256 * 1024 * 1024


def env_float(name: str, default: float | None = None) -> float:
    """The number of the setting ``name`` (read and checked by :func:`hora.settings.get`);
    ``default`` only where the setting declares none.

    Raises:
        ConfigError: the variable is set but malformed or outside its bounds.
    """
    value = settings.get(name)
    return default if value is None else value


def make_secret() -> bytes:
    """Return a fresh random per-job secret (32 bytes)."""
    return secrets.token_bytes(32)


@dataclasses.dataclass(frozen=True)
class WorkerEnv:
    """Everything a worker learns from its launcher, as read from ``HORA_*`` variables."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    rendezvous_addr: str
    secret: bytes = dataclasses.field(repr=False)
    job_id: str = "hora"
    hostname: str = "127.0.0.1"
    backend: str = "auto"
    start_timeout: float = DEFAULT_START_TIMEOUT

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"{ENV_SIZE} must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"{ENV_RANK}={self.rank} is outside [0, {self.size})")
        if not 0 <= self.local_rank < self.local_size:
            raise ConfigError(f"{ENV_LOCAL_RANK}={self.local_rank} is outside [0, {self.local_size})")
        if not 0 <= self.cross_rank < self.cross_size:
            raise ConfigError(f"{ENV_CROSS_RANK}={self.cross_rank} is outside [0, {self.cross_size})")
        if self.backend not in settings.BACKENDS:
            raise ConfigError(f"{ENV_BACKEND}={self.backend!r} is unknown; use one of {', '.join(settings.BACKENDS)}")
        if self.start_timeout <= 0:
            raise ConfigError(f"{ENV_START_TIMEOUT} must be > 0, got {self.start_timeout}")
        if ":" not in self.rendezvous_addr:
            raise ConfigError(f"{ENV_RENDEZVOUS_ADDR}={self.rendezvous_addr!r} is not host:port")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the contract from ``environ`` (default ``os.environ``).

        Raises:
            ConfigError: a required variable is missing or malformed.
        """
        env = os.environ if environ is None else environ
        missing = [k for k in (ENV_RANK, ENV_SIZE, ENV_RENDEZVOUS_ADDR, ENV_SECRET) if not env.get(k)]
        if missing:
            raise ConfigError(
                "this process was not started by a hora launcher: missing environment "
                f"variable(s) {', '.join(missing)} (use `hora run`, hora.runners.run, or set them)"
            )

        def get(name: str) -> Any:
            return settings.get(name, env)

        rank, size = get(ENV_RANK), get(ENV_SIZE)
        try:
            secret = bytes.fromhex(env[ENV_SECRET])
        except ValueError:
            raise ConfigError(f"{ENV_SECRET} is not hex") from None
        local_rank, local_size = get(ENV_LOCAL_RANK), get(ENV_LOCAL_SIZE)
        return cls(
            rank=rank,
            size=size,
            local_rank=rank if local_rank is None else local_rank,
            local_size=size if local_size is None else local_size,
            cross_rank=get(ENV_CROSS_RANK),
            cross_size=get(ENV_CROSS_SIZE),
            rendezvous_addr=env[ENV_RENDEZVOUS_ADDR],
            secret=secret,
            job_id=get(ENV_JOB_ID) or settings.default(ENV_JOB_ID),
            hostname=get(ENV_HOSTNAME) or settings.default(ENV_HOSTNAME),
            backend=get(ENV_BACKEND),
            start_timeout=get(ENV_START_TIMEOUT),
        )

    def to_environ(self) -> dict[str, str]:
        """The ``HORA_*`` variables that make :meth:`from_environ` return this object."""
        return {
            ENV_RANK: str(self.rank),
            ENV_SIZE: str(self.size),
            ENV_LOCAL_RANK: str(self.local_rank),
            ENV_LOCAL_SIZE: str(self.local_size),
            ENV_CROSS_RANK: str(self.cross_rank),
            ENV_CROSS_SIZE: str(self.cross_size),
            ENV_RENDEZVOUS_ADDR: self.rendezvous_addr,
            ENV_SECRET: self.secret.hex(),
            ENV_JOB_ID: self.job_id,
            ENV_HOSTNAME: self.hostname,
            ENV_BACKEND: self.backend,
            ENV_START_TIMEOUT: str(self.start_timeout),
        }


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one rank sits: its local rank/size on its host and cross rank/size across hosts."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def compute_placement(hosts: Sequence[str]) -> list[Placement]:
    """Derive local and cross ranks from the host of each rank (index = rank).

    ``local_rank`` counts the ranks before this one on the same host; ``cross_rank`` is the
    index of this host among the hosts that have a rank with the same ``local_rank``
    (Horovod's definition), in order of first appearance.
    """
    per_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        per_host.setdefault(host, []).append(rank)
    out = []
    for rank, host in enumerate(hosts):
        local_rank = per_host[host].index(rank)
        peers = [h for h, ranks in per_host.items() if len(ranks) > local_rank]
        out.append(
            Placement(
                rank=rank,
                host=host,
                local_rank=local_rank,
                local_size=len(per_host[host]),
                cross_rank=peers.index(host),
                cross_size=len(peers),
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# Wire format
# ---------------------------------------------------------------------------------------
def _sign(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest()


def _send_frame(sock: socket.socket, secret: bytes, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(_MAGIC, len(body), _sign(secret, body)) + body)


class PeerClosedError(RendezvousError, ConnectionError):
    """The peer closed the connection before a whole message arrived (a ConnectionError too)."""


class FrameError(RendezvousError):
    """Bytes that are not a frame of this job: malformed, too large, unauthenticated or incomplete."""


class AuthenticationError(FrameError):
    """A frame failed the HMAC check or was malformed."""


#: seconds the rest of a frame may take once its first byte arrived (a stalled sender is dropped)
FRAME_TIMEOUT = 60.0


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``.

    Raises:
        PeerClosedError: the peer closed the connection first (a ConnectionError).
    """
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise PeerClosedError("connection closed by peer")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket, secret: bytes, frame_timeout: float | None = None) -> Any:
    """The next frame's object, unpickled only after its HMAC checks out.

    With ``frame_timeout`` (the server's side) the first byte is awaited with the socket's own
    timeout (an idle client may wait long) and the rest of the frame must follow within
    ``frame_timeout`` seconds.

    Raises:
        PeerClosedError: the connection ended, before a frame or within one.
        FrameError: bad magic, a length over the limit, a failed HMAC, or a frame that stalled.
    """
    if frame_timeout is None:
        header = recv_exact(sock, _HEADER.size)
    else:
        first = recv_exact(sock, 1)
        previous = sock.gettimeout()
        sock.settimeout(frame_timeout)
        try:
            header = first + recv_exact(sock, _HEADER.size - 1)
        except TimeoutError:
            raise FrameError(f"an incomplete frame header (nothing more within {frame_timeout:g} s)") from None
    magic, length, mac = _HEADER.unpack(header)
    if magic != _MAGIC:
        raise AuthenticationError(f"bad frame magic {magic!r}")
    if length > _MAX_FRAME:
        raise AuthenticationError(f"frame of {length} bytes exceeds the {_MAX_FRAME} byte limit")
    try:
        body = recv_exact(sock, length)
    except TimeoutError:
        raise FrameError(f"an incomplete frame of {length} bytes (stalled for {frame_timeout:g} s)") from None
    finally:
        if frame_timeout is not None:
            sock.settimeout(previous)
    if not hmac.compare_digest(mac, _sign(secret, body)):
        raise AuthenticationError("frame failed HMAC authentication (wrong job secret?)")
    return pickle.loads(body)  # only after the HMAC check


# ---------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------
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
                request = _recv_frame(sock, secret, FRAME_TIMEOUT)
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
                _send_frame(sock, secret, reply)
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
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="hora-rendezvous", daemon=True
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


# ---------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------
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

    def with_timeout(self, timeout: float) -> KVClient:
        """A new client of the same server whose connects and calls give up after ``timeout``
        seconds (its own connection, so a slow call of this one never blocks the other)."""
        return KVClient(f"{self._addr[0]}:{self._addr[1]}", self._secret, timeout=timeout)

    @classmethod
    def from_env(cls, env: WorkerEnv) -> KVClient:
        return cls(env.rendezvous_addr, env.secret)

    def _connect(self, deadline: float) -> socket.socket:
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(self._addr, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
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
                    _send_frame(sock, self._secret, request)
                    status, value = _recv_frame(sock, self._secret)
                    break
                except (ConnectionError, socket.timeout, OSError) as exc:
                    self.close_locked()
                    if attempt == 1 or request[0] == "add":  # add is not idempotent
                        raise RendezvousError(f"lost the rendezvous server at {self._addr[0]}:{self._addr[1]}: {exc}") from exc
        if status == "error":
            raise RendezvousError(value)
        return value

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


__all__ = [
    "WorkerEnv",
    "Placement",
    "compute_placement",
    "RendezvousServer",
    "KVClient",
    "AuthenticationError",
    "FrameError",
    "PeerClosedError",
    "barrier",
    "make_secret",
    "env_float",
]
