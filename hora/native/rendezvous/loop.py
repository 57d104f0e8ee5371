"""The rendezvous server's event loop: one thread, one ``selectors`` selector, every
connection non-blocking (see :mod:`.server`)."""

from __future__ import annotations

import collections
import hashlib
import heapq
import hmac
import itertools
import logging
import pickle
import selectors
import socket
import ssl
import threading
import time
from typing import Any

from hora.errors import RendezvousError
from hora.native.rendezvous.protocol import FRAME_TIMEOUT, HEADER, MAGIC, MAX_FRAME, check_magic
from hora.native.rendezvous.table import Table, Waiter, timeout_error

log = logging.getLogger("hora.native.rendezvous")

#: the longest the loop sleeps without looking at its timers (frame timeouts, wait deadlines);
#: ``stop`` wakes it at once through its wake-up socket
SHUTDOWN_POLL_S = 0.05
#: connections of one address that have not yet sent a signed frame (beyond: refused)
MAX_UNSIGNED_PER_HOST = 1024
#: connections accepted per turn of the loop before it reads what the accepted ones sent
ACCEPT_BURST = 64
#: requests of one batch
MAX_BATCH = 100_000
_WRITE_OPS = ("set", "add", "delete")
_WRITE_ARITY = {"set": 3, "add": 3, "delete": 2}  # the length of each write's tuple
#: a non-blocking socket (plain or TLS) that cannot go on now: the selector says when it can
_AGAIN = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class _Conn:
    __slots__ = ("sock", "peer", "host", "inbuf", "out", "since", "signed", "waiter", "wait_op", "wait_timeout",
                 "timer", "closed", "opened", "handshaking")

    def __init__(self, sock: socket.socket, peer: str, host: str, now: float) -> None:
        self.sock = sock
        self.peer = peer
        self.host = host
        self.inbuf = bytearray()
        self.out = bytearray()  # reply bytes the socket did not take yet
        self.since: float | None = None  # when the frame being read began (None: between frames)
        self.signed = False  # sent one signed frame
        self.waiter: Waiter | None = None  # its parked wait/watch
        self.wait_op = "wait"
        self.wait_timeout = 0.0
        self.timer: list | None = None
        self.closed = False
        self.opened = now
        self.handshaking = False  # a TLS connection before its handshake completed


class _Loop:
    """The server's event loop (one thread)."""

    def __init__(self, sock: socket.socket, secret: bytes, table: Table, tls: ssl.SSLContext | None = None) -> None:
        self.listener = sock
        self.secret = secret
        self.tls = tls  # every accepted connection speaks TLS first (hora.native.rendezvous.tls)
        self.table = table
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.closing = False
        self.conns: set[_Conn] = set()
        self.unsigned: collections.Counter[str] = collections.Counter()
        self.timers: list[list] = []  # heap of [deadline, n, conn, kind]
        self._count = itertools.count()
        self.posted: collections.deque = collections.deque()  # callables from other threads
        self.logged: set[tuple[str, str]] = set()
        self.dropped: collections.Counter[tuple[str, str]] = collections.Counter()
        self.accept_paused_until = 0.0
        self.last_turn = time.monotonic()
        self.thread_id: int | None = None

    # cross-thread -------------------------------------------------------------------------
    def post(self, fn: Any) -> None:
        """Run ``fn()`` on the loop's thread soon."""
        self.posted.append(fn)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake, or closing

    # logging ------------------------------------------------------------------------------
    def _drop_log(self, host: str, kind: str, msg: str, *args: Any) -> None:
        """Warn once per address and kind; later drops of the same kind are counted (DEBUG)."""
        self.dropped[(host, kind)] += 1
        if (host, kind) in self.logged:
            log.debug(msg, *args)
            return
        self.logged.add((host, kind))
        log.warning(msg + " (further such drops from this address are logged at DEBUG)", *args)

    # the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.thread_id = threading.get_ident()
        try:
            while not self.closing:
                timeout = SHUTDOWN_POLL_S
                if self.timers:
                    timeout = max(0.0, min(timeout, self.timers[0][0] - time.monotonic()))
                for key, mask in self.sel.select(timeout):
                    data = key.data
                    if data is None:
                        self._accept()
                    elif data == "wake":
                        self._drain_wake()
                    else:
                        try:
                            if data.handshaking:
                                self._handshake(data)
                                continue
                            if mask & selectors.EVENT_WRITE:
                                self._flush(data)
                            if mask & selectors.EVENT_READ and not data.closed:
                                self._read(data)
                        except Exception:  # never the loop's end because of one peer
                            log.warning("rendezvous: dropping connection from %s after an error", data.peer,
                                        exc_info=True)
                            self._close(data)
                while self.posted:
                    try:
                        self.posted.popleft()()
                    except Exception:
                        log.warning("rendezvous: a wake-up failed", exc_info=True)
                now = time.monotonic()
                self.last_turn = now
                self._expire(now)
        finally:
            for conn in list(self.conns):
                self._close(conn)
            self.sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _accept(self) -> None:
        now = time.monotonic()
        if now < self.accept_paused_until:
            return
        for _ in range(ACCEPT_BURST):
            try:
                sock, addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: let the others be served meanwhile
                self._drop_log("*", "accept", "rendezvous: cannot accept connections: %s", exc)
                self.accept_paused_until = now + 0.1
                return
            host = str(addr[0])
            if self.unsigned[host] >= MAX_UNSIGNED_PER_HOST:
                self._drop_log(host, "flood", "rendezvous: refusing a connection from %s: %d connections of it "
                               "have sent no signed frame yet", host, self.unsigned[host])
                sock.close()
                continue
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (ssl.SSLError, OSError) as exc:
                    self._drop_log(host, "tls", "rendezvous: dropping connection from %s:%s: %s", addr[0], addr[1], exc)
                    sock.close()
                    continue
            conn = _Conn(sock, "%s:%s" % (addr[0], addr[1]), host, now)
            conn.handshaking = self.tls is not None
            self.unsigned[host] += 1
            self.conns.add(conn)
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self._set_timer(conn, now + FRAME_TIMEOUT, "idle")

    def _set_timer(self, conn: _Conn, deadline: float, kind: str) -> None:
        if conn.timer is not None:
            conn.timer[2] = None  # cancelled: skipped when it comes up
        entry = [deadline, next(self._count), conn, kind]
        conn.timer = entry
        heapq.heappush(self.timers, entry)

    def _expire(self, now: float) -> None:
        timers = self.timers
        while timers and timers[0][0] <= now:
            _, _, conn, kind = heapq.heappop(timers)
            if conn is None or conn.closed:
                continue
            conn.timer = None
            if kind == "wait":
                self._wait_timed_out(conn)
            elif kind == "frame":
                self._drop_log(conn.host, "stall", "rendezvous: dropping connection from %s: an incomplete frame "
                               "(nothing more within %g s)", conn.peer, FRAME_TIMEOUT)
                self._close(conn)
            elif kind == "idle" and not conn.signed:
                self._drop_log(conn.host, "silent", "rendezvous: dropping connection from %s: no signed frame "
                               "within %g s", conn.peer, FRAME_TIMEOUT)
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if not conn.signed:
            self.unsigned[conn.host] -= 1
            if self.unsigned[conn.host] <= 0:
                del self.unsigned[conn.host]
        if conn.waiter is not None:
            with self.table.lock:
                self.table.cancel_locked(conn.waiter)
            conn.waiter = None
        if conn.timer is not None:
            conn.timer[2] = None
            conn.timer = None
        self.conns.discard(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    # TLS ----------------------------------------------------------------------------------
    def _handshake(self, conn: _Conn) -> None:
        """Take the TLS handshake of ``conn`` one step; a peer that does not speak TLS to this
        job's certificate (a plaintext client, a port scanner) is dropped, naming its address."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.sel.modify(sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except (ssl.SSLError, OSError) as exc:
            self._drop_log(conn.host, "tls", "rendezvous: refusing the connection from %s: no TLS handshake with "
                           "this job's certificate (%s)", conn.peer, exc)
            self._close(conn)
            return
        conn.handshaking = False
        self.sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0), conn)
        if sock.pending():
            self._read(conn)

    # reading ------------------------------------------------------------------------------
    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        try:
            data = sock.recv(262144)
        except _AGAIN:
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        if isinstance(sock, ssl.SSLSocket):  # a record read and decrypted already never wakes the selector
            while sock.pending():
                try:
                    more = sock.recv(262144)
                except _AGAIN:
                    break
                except OSError:  # the next turn's read sees the end
                    break
                if not more:
                    break
                conn.inbuf += more
        self._frames(conn)

    def _frames(self, conn: _Conn) -> None:
        """Answer the complete frames in ``conn``'s buffer, in order (none while a wait is parked)."""
        buf = conn.inbuf
        size = HEADER.size
        while buf and conn.waiter is None and not conn.closed:
            if len(buf) < size:
                self._frame_begun(conn)
                return
            magic, length, mac = HEADER.unpack_from(buf)
            refused = check_magic(bytes(magic))
            if refused is not None:
                self._reject(conn, refused)
                return
            if length > MAX_FRAME:
                self._reject(conn, f"frame of {length} bytes exceeds the {MAX_FRAME} byte limit")
                return
            end = size + length
            if len(buf) < end:
                self._frame_begun(conn)
                return
            body = bytes(buf[size:end])
            del buf[:end]
            if not hmac.compare_digest(mac, hmac.digest(self.secret, body, hashlib.sha256)):
                self._reject(conn, "frame failed HMAC authentication (wrong job secret?)")
                return
            try:
                request = pickle.loads(body)  # only after the HMAC check
            except Exception as exc:  # signed garbage cannot happen; be safe anyway
                self._reject(conn, f"unreadable frame ({exc})")
                return
            if not conn.signed:
                conn.signed = True
                self.unsigned[conn.host] -= 1
                if self.unsigned[conn.host] <= 0:
                    del self.unsigned[conn.host]
            if conn.since is not None or conn.timer is not None:
                conn.since = None
                if conn.timer is not None:
                    conn.timer[2] = None
                    conn.timer = None
            self._request(conn, request)

    def _frame_begun(self, conn: _Conn) -> None:
        if conn.since is None:
            conn.since = time.monotonic()
            self._set_timer(conn, conn.since + FRAME_TIMEOUT, "frame")

    def _reject(self, conn: _Conn, why: str) -> None:
        self._drop_log(conn.host, "frame", "rendezvous: dropping connection from %s: %s", conn.peer, why)
        self._close(conn)

    # answering ----------------------------------------------------------------------------
    def _request(self, conn: _Conn, request: Any) -> None:
        try:
            if not isinstance(request, tuple) or not request or not isinstance(request[0], str):
                raise ValueError("request is not an (op, ...) tuple")
            op = request[0]
            if op in ("wait", "watch"):
                _, keys, timeout = request
                self._park(conn, op, [str(k) for k in keys], float(timeout))
                return
            if op == "post":  # one-way writes (heartbeats): applied, never answered
                (writes,) = request[1:]
                with self.table.lock:
                    self._writes_locked(writes)
                return
            with self.table.lock:
                value = self._dispatch_locked(request)
            reply: tuple = ("ok", value)
        except RendezvousError as exc:
            reply = ("error", str(exc))
        except Exception as exc:
            log.warning("rendezvous: bad request from %s: %r", conn.peer, exc)
            reply = ("error", f"bad request: {exc!r}")
        if not (isinstance(request, tuple) and request[:1] == ("post",)):  # one-way writes get no answer
            self._send(conn, reply)

    def _dispatch_locked(self, request: tuple) -> Any:
        table = self.table
        op, args = request[0], request[1:]
        if op == "add":
            key, amount = args
            return table.add_locked(str(key), int(amount))
        if op == "set":
            key, value = args
            table.set_locked(str(key), bytes(value))
            return None
        if op == "batch":
            (requests,) = args
            return self._writes_locked(requests)
        if op == "delete":
            return table.delete_locked(str(args[0]))
        if op == "keys":
            return table.keys_locked(str(args[0]))
        if op == "ping":
            return "pong"
        raise ValueError(f"unknown op {op!r}")

    def _writes_locked(self, requests: Any) -> list[Any]:
        """Apply a batch's (or a post's) writes in order, all checked first; their results.
        (The heartbeats of a whole host come this way: one call, no dispatch per write.)"""
        if not isinstance(requests, list) or len(requests) > MAX_BATCH:
            raise ValueError("a batch is a list of at most %d requests" % MAX_BATCH)
        for r in requests:
            if type(r) is not tuple or len(r) != _WRITE_ARITY.get(r[0] if r else None, -1):
                raise ValueError(f"a batch holds only {', '.join(_WRITE_OPS)} requests, not {r!r}")
        table = self.table
        out: list[Any] = []
        for r in requests:
            op = r[0]
            if op == "add":
                out.append(table.add_locked(str(r[1]), int(r[2])))
            elif op == "set":
                table.set_locked(str(r[1]), bytes(r[2]))
                out.append(None)
            else:
                out.append(table.delete_locked(str(r[1])))
        return out

    def _park(self, conn: _Conn, op: str, keys: list[str], timeout: float) -> None:
        def fire(values: list[bytes]) -> None:  # under the table's lock, on any thread
            if threading.get_ident() == self.thread_id:
                self._woken(conn, values)
            else:
                self.post(lambda: self._woken(conn, values))

        waiter = Waiter(keys, fire)
        with self.table.lock:
            values = self.table.get_locked(keys)
            if values is None:
                self.table.add_waiter_locked(waiter)
        if values is not None:
            self._send(conn, ("ok", values))
            return
        conn.waiter, conn.wait_op, conn.wait_timeout = waiter, op, timeout
        self._set_timer(conn, time.monotonic() + max(0.0, timeout), "wait")

    def _woken(self, conn: _Conn, values: list[bytes]) -> None:
        if conn.closed or conn.waiter is None:
            return
        conn.waiter = None
        if conn.timer is not None:
            conn.timer[2] = None
            conn.timer = None
        self._send(conn, ("ok", values))
        self._frames(conn)  # requests that came while it waited

    def _wait_timed_out(self, conn: _Conn) -> None:
        waiter = conn.waiter
        if waiter is None:
            return
        with self.table.lock:
            if waiter.done:  # fired meanwhile: its answer is posted
                return
            missing = self.table.cancel_locked(waiter)
        conn.waiter = None
        if conn.wait_op == "watch":
            self._send(conn, ("ok", None))
        else:
            self._send(conn, ("error", str(timeout_error(conn.wait_timeout, missing))))
        self._frames(conn)

    # writing ------------------------------------------------------------------------------
    def _send(self, conn: _Conn, reply: tuple) -> None:
        if conn.closed:
            return
        body = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        frame = HEADER.pack(MAGIC, len(body), hmac.digest(self.secret, body, hashlib.sha256)) + body
        if conn.out:
            conn.out += frame
            return
        if conn.handshaking:  # cannot happen (no request before the handshake); kept for the flush
            conn.out += frame
            return
        try:
            sent = conn.sock.send(frame)
        except _AGAIN:
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent < len(frame):
            conn.out += frame[sent:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except _AGAIN:
            return
        except OSError:
            self._close(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
