"""A reverse proxy in front of an S3-protocol server that fails a share of the requests.

``FaultyProxy(upstream, fail=0.3, reset=0.05, seed=1)`` listens on 127.0.0.1; each
request is, by a seeded draw, answered ``503 SlowDown`` (or ``500 InternalError``) with
S3's XML error body, dropped by closing the connection before any answer (a reset), or
forwarded to ``upstream`` and its answer passed back. Counts per outcome are kept in
``counts``. Used by the Store's retry tests and the chaos benchmarks; only loopback.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_ERRORS = (
    (503, "SlowDown", "Please reduce your request rate."),
    (500, "InternalError", "We encountered an internal error. Please try again."),
)


class FaultyProxy:
    """A fault-injecting HTTP reverse proxy (see the module doc)."""

    def __init__(self, upstream: str, fail: float = 0.0, reset: float = 0.0, seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.fail, self.reset = float(fail), float(reset)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "failed": 0, "reset": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _any(self) -> None:
                body = self._body()
                with proxy.lock:
                    draw = proxy.rng.random()
                if draw < proxy.reset:
                    with proxy.lock:
                        proxy.counts["reset"] += 1
                    # an RST, not a polite FIN: SO_LINGER with a zero timeout
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if draw < proxy.reset + proxy.fail:
                    with proxy.lock:
                        proxy.counts["failed"] += 1
                        status, code, text = _ERRORS[proxy.rng.randrange(len(_ERRORS))]
                    payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                               f"<Message>{text}</Message></Error>").encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                with proxy.lock:
                    proxy.counts["forwarded"] += 1
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("connection", "transfer-encoding", "content-length")}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    head = self.command == "HEAD"  # a HEAD answer keeps the object's Content-Length
                    for key, value in answer.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection") and (
                                head or key.lower() != "content-length"):
                            self.send_header(key, value)
                    if not head:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="faulty-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FaultyProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
