"""The rendezvous wire format: signed frames.

Every frame, in both directions, is ``MAGIC | length | HMAC-SHA256 | body``. The HMAC
is computed with the job's secret over the body and is checked *before* the body is
unpickled (:func:`recv_frame`); anything malformed raises :class:`FrameError`.

The magic carries the protocol's version: ``HOR`` and one version byte. Version 2 added the
one-way ``post``, the parked ``watch`` and ``batch`` requests; a peer of another version is
refused by both ends with an error that names both versions (:func:`check_magic`), instead of
misreading the other side's replies.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import socket
import struct
from typing import Any

from hora.errors import RendezvousError

#: the protocol's version, the last byte of :data:`MAGIC`
PROTOCOL_VERSION = 2
MAGIC = b"HOR" + bytes([0x30 + PROTOCOL_VERSION])  # b"HOR2"
#: the magic of frames written before the version byte (version 1)
_MAGIC_V1 = b"HORA"
HEADER = struct.Struct("!4sI32s")
MAX_FRAME = 256 * 1024 * 1024


def check_magic(magic: bytes) -> str | None:
    """Why a frame header's ``magic`` is refused, or None when it is this protocol's."""
    if magic == MAGIC:
        return None
    if magic == _MAGIC_V1:
        return (f"a peer speaks hora's control protocol version 1, this end version {PROTOCOL_VERSION}: "
                "the driver and its ranks must run the same hora release")
    if magic[:3] == b"HOR" and 0x30 <= magic[3] <= 0x39:
        return (f"a peer speaks hora's control protocol version {magic[3] - 0x30}, this end version "
                f"{PROTOCOL_VERSION}: the driver and its ranks must run the same hora release")
    return f"bad frame magic {bytes(magic)!r}"


def sign(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest()


def send_frame(sock: socket.socket, secret: bytes, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(MAGIC, len(body), sign(secret, body)) + body)


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


def recv_frame(sock: socket.socket, secret: bytes, frame_timeout: float | None = None) -> Any:
    """The next frame's object, unpickled only after its HMAC checks out.

    With ``frame_timeout`` (the server's side) the first byte is awaited with the socket's own
    timeout (an idle client may wait long) and the rest of the frame must follow within
    ``frame_timeout`` seconds.

    Raises:
        PeerClosedError: the connection ended, before a frame or within one.
        FrameError: bad magic, a length over the limit, a failed HMAC, or a frame that stalled.
    """
    if frame_timeout is None:
        header = recv_exact(sock, HEADER.size)
    else:
        first = recv_exact(sock, 1)
        previous = sock.gettimeout()
        sock.settimeout(frame_timeout)
        try:
            header = first + recv_exact(sock, HEADER.size - 1)
        except TimeoutError:
            raise FrameError(f"an incomplete frame header (nothing more within {frame_timeout:g} s)") from None
    magic, length, mac = HEADER.unpack(header)
    refused = check_magic(magic)
    if refused is not None:
        raise AuthenticationError(refused)
    if length > MAX_FRAME:
        raise AuthenticationError(f"frame of {length} bytes exceeds the {MAX_FRAME} byte limit")
    try:
        body = recv_exact(sock, length)
    except TimeoutError:
        raise FrameError(f"an incomplete frame of {length} bytes (stalled for {frame_timeout:g} s)") from None
    finally:
        if frame_timeout is not None:
            sock.settimeout(previous)
    if not hmac.compare_digest(mac, sign(secret, body)):
        raise AuthenticationError("frame failed HMAC authentication (wrong job secret?)")
    return pickle.loads(body)  # only after the HMAC check


__all__ = [
    "FRAME_TIMEOUT", "HEADER", "MAGIC", "MAX_FRAME", "PROTOCOL_VERSION", "check_magic", "AuthenticationError", "FrameError", "PeerClosedError",
    "recv_exact", "recv_frame", "send_frame", "sign",
]
