"""One retry policy for every Store operation, whatever the fsspec implementation.

Object stores throttle and drop connections as a matter of course (S3 answers ``503
SlowDown`` under load; a busy bucket resets connections). s3fs, gcsfs, adlfs and HDFS
each retry some of these, differently, and give up at different points, so hora keeps
its own policy above them:

- :func:`classify` tells a *transient* failure (HTTP 429/500/502/503/504, SlowDown and
  throttling codes, connection reset/refused/aborted, timeouts, ``EBUSY``/``EAGAIN``)
  from a *permanent* one (403/permission, a missing file, no space left, a bad URL or a host name that does not resolve, a
  programming error). Permanent failures are raised at once.
- :func:`call` runs an operation and retries transient failures with exponential
  backoff and full jitter (``sleep = uniform(0, min(cap, base * 2**attempt))``, as S3
  clients' standard retry mode does) until the time budget ``HORA_STORE_RETRY_S``
  (default 120 s) is spent; then it raises the last error, saying how often and for
  how long it tried.
- :class:`ResumableReader` wraps a file opened for reading: a read that fails
  transiently mid-file reopens the file and resumes at its offset, so a retried read
  never hands a short or empty buffer to its caller as data.

The filesystems' own retries are set to one attempt (:func:`single_attempt`,
:func:`single_attempt_options`: s3fs's, botocore's, gcsfs's), so the budget above is the
only one: a dead endpoint fails after ``HORA_STORE_RETRY_S``, not after that times theirs.

Retries are counted per kind of failure (:func:`retry_counts`) and logged once per kind
and process at WARNING, then at DEBUG.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import re
import socket
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

from hora import settings

logger = logging.getLogger(__name__)

ENV_STORE_RETRY_S = "HORA_STORE_RETRY_S"
#: first backoff ceiling and the largest one, in seconds
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 5.0

T = TypeVar("T")

TRANSIENT, PERMANENT = "transient", "permanent"

_TRANSIENT_ERRNOS = {
    errno.EBUSY, errno.EAGAIN, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
    errno.EPIPE, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETRESET, errno.EINTR,
}
_PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EROFS,
                     errno.EISDIR, errno.ENOTDIR, errno.EINVAL, errno.ENAMETOOLONG}
# name resolution answers that mean the host does not exist (EAI_AGAIN, a resolver's hiccup, is retried)
_PERMANENT_DNS = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_SERVICE") if hasattr(socket, n)}
# HTTP statuses and service codes that say "try again" (AWS, GCS, Azure spell them so)
_TRANSIENT_CODES = {
    "429", "500", "502", "503", "504", "slowdown", "throttling", "throttlingexception", "requestlimitexceeded",
    "toomanyrequests", "requesttimeout", "requesttimeouterror", "internalerror", "serviceunavailable",
    "servererror", "serverbusy", "operationtimedout", "requestthrottled", "provisionedthroughputexceeded",
}
_PERMANENT_CODES = {"403", "404", "400", "accessdenied", "nosuchbucket", "nosuchkey", "invalidaccesskeyid",
                    "signaturedoesnotmatch", "invalidbucketname", "allaccessdisabled", "notfound"}
# exception class names of HTTP clients under fsspec implementations that mean a dropped or timed-out
# connection (matched by name: hora does not import aiohttp, botocore or urllib3)
_TRANSIENT_CLASSES = {
    "ClientConnectionError", "ClientConnectorError", "ServerDisconnectedError", "ClientOSError",
    "ServerTimeoutError", "ClientPayloadError", "EndpointConnectionError", "ConnectionClosedError",
    "ReadTimeoutError", "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
    "ProtocolError", "IncompleteRead", "RemoteDisconnected", "ChunkedEncodingError", "HttpResponseError",
    "ServiceRequestError", "ServiceResponseError", "TransportError", "RetryError",
}
_TEXT_TRANSIENT = re.compile(
    r"\b(slow ?down|service unavailable|too many requests|throttl\w*|internal (server )?error|bad gateway|"
    r"gateway time-?out|connection (reset|refused|aborted|closed)|timed? ?out|temporarily unavailable|"
    r"server disconnected|try again|reduce your request rate)\b|\b(429|500|502|503|504)\b",
    re.IGNORECASE,
)

_counts: dict[str, int] = {}
_counts_lock = threading.Lock()


_local = threading.local()


def budget_s() -> float:
    """The retry budget in seconds: ``HORA_STORE_RETRY_S`` (0 turns retries off), or less inside
    :func:`limited` in this thread."""
    budget = float(settings.get(ENV_STORE_RETRY_S))
    cap = getattr(_local, "cap", None)
    return budget if cap is None else min(budget, cap)


@contextlib.contextmanager
def limited(seconds: float) -> Iterator[None]:
    """Cap the retry budget of this thread's Store operations at ``seconds`` for a while.

    Reachability checks use it: they must answer within their own timeout (``HORA_STORE_TIMEOUT``)
    with the store's real error ("Could not connect ..."), not spend it all retrying.
    """
    previous = getattr(_local, "cap", None)
    _local.cap = seconds if previous is None else min(previous, seconds)
    try:
        yield
    finally:
        _local.cap = previous


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 8:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _service_code(exc: BaseException) -> str | None:
    """The HTTP status or service error code an exception carries (botocore's ``response``,
    Azure's ``status_code``, gcsfs's ``code``), lowercased."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        code = error.get("Code") or (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code is not None:
            return str(code).lower()
    for attr in ("status_code", "status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, (int, str)) and str(value).strip():
            return str(value).lower()
    return None


def kind_of(exc: BaseException) -> str:
    """A short name of the failure, for counting and logging (``EBUSY``, ``503``, ``ConnectionResetError``)."""
    for e in _chain(exc):
        code = _service_code(e)
        if code is not None and code in _TRANSIENT_CODES:
            return code.upper() if not code.isdigit() else code
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return errno.errorcode.get(e.errno, str(e.errno))
    return type(exc).__name__


def classify(exc: BaseException) -> str:
    """``"transient"`` when retrying may succeed, ``"permanent"`` otherwise.

    Looks at the exception and its causes: service codes and HTTP statuses, ``errno``,
    the connection and timeout errors of the HTTP clients under fsspec, and as a last
    resort the message of an ``OSError`` (s3fs turns a 503 into ``OSError(EBUSY,
    'Service Unavailable')``, some clients only say it in words).
    """
    chain = _chain(exc)
    for e in chain:  # explicit codes decide first
        code = _service_code(e)
        if code is not None:
            if code in _TRANSIENT_CODES:
                return TRANSIENT
            if code in _PERMANENT_CODES:
                return PERMANENT
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return PERMANENT
        if isinstance(e, socket.gaierror):  # a host name that does not exist is a bad URL; a DNS hiccup is not
            return PERMANENT if e.errno in _PERMANENT_DNS else TRANSIENT
        if isinstance(e, OSError) and e.errno is not None:
            if e.errno in _TRANSIENT_ERRNOS:
                return TRANSIENT
            if e.errno in _PERMANENT_ERRNOS:
                return PERMANENT
    for e in chain:
        if isinstance(e, (ConnectionError, TimeoutError)):
            return TRANSIENT
        if type(e).__name__ in _TRANSIENT_CLASSES:
            return TRANSIENT
    for e in chain:
        if isinstance(e, OSError) and _TEXT_TRANSIENT.search(str(e)):
            return TRANSIENT
    return PERMANENT


def _note(kind: str, what: str, url: str, attempt: int, exc: BaseException) -> None:
    with _counts_lock:
        first = kind not in _counts
        _counts[kind] = _counts.get(kind, 0) + 1
    level = logging.WARNING if first else logging.DEBUG
    logger.log(level, "store: %s %s failed transiently (%s: %s); retrying (attempt %d; further %s retries are "
               "logged at DEBUG)", what, url, kind, exc, attempt, kind)


def retry_counts() -> dict[str, int]:
    """Retries made in this process so far, per kind of failure."""
    with _counts_lock:
        return dict(_counts)


def reset_counts() -> None:
    """Forget the retry counts (and log the next retry of each kind at WARNING again)."""
    with _counts_lock:
        _counts.clear()


def single_attempt_options(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for the fsspec filesystem of ``protocol`` with its HTTP client's own retries
    set to one attempt, so that the Store's policy (:func:`call`) is the only retry budget:
    botocore's (under s3fs) retry up to 5 attempts with backoff inside every attempt of the
    Store's, which multiplied the time a dead endpoint takes to fail. A user's own
    ``config_kwargs={"retries": ...}`` is kept."""
    if protocol != "s3":
        return dict(options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    return {**options, "config_kwargs": config}


def single_attempt(fs: Any) -> Any:
    """``fs`` with the filesystem's own retry loop set to one attempt (s3fs's and gcsfs's
    ``retries``: 5 and 6 attempts with backoff by default); the Store's policy retries instead.
    Filesystems without one are returned as they are."""
    if isinstance(getattr(type(fs), "retries", None), int):
        fs.retries = 1
    return fs


def call(what: str, url: str, fn: Callable[..., T], *args: Any, budget: float | None = None,
         sleep: Callable[[float], None] | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retrying transient failures within the retry budget.

    Args:
        what: the operation, for messages (``"read"``, ``"open"``).
        url: the URL it works on, for messages.
        budget: seconds to keep retrying (default :func:`budget_s`).
        sleep: the sleep function (default ``time.sleep``; tests pass a fake one).

    Raises:
        The operation's own exception when it is permanent, or the last transient one when
        the budget is spent; in the latter case the exception gets a note (``add_note``)
        saying how many attempts were made over how many seconds.
    """
    budget = budget_s() if budget is None else budget
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if classify(exc) != TRANSIENT:
                raise
            attempt += 1
            elapsed = time.monotonic() - start
            delay = random.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * (2 ** min(attempt, 30))))
            if elapsed + delay > budget:
                exc.add_note(f"hora: {what} {url}: gave up after {attempt} attempt(s) over {elapsed:.1f} s of "
                             f"transient failures ({ENV_STORE_RETRY_S}={budget:g})")
                raise
            _note(kind_of(exc), what, url, attempt, exc)
            (sleep or time.sleep)(delay)


class ResumableReader:
    """A read-only file over ``opener(offset)`` that survives transient failures mid-file.

    ``opener`` returns a fresh binary file object; every failed ``read`` or ``seek`` is
    retried by :func:`call` on a newly opened file positioned at the offset the caller
    has reached, and a read returns exactly the bytes asked for unless the file ends
    (known from ``size``). It has what pyarrow's ``PythonFile`` and ``io`` callers need:
    ``read``, ``readinto``, ``seek``, ``tell``, ``size``, ``close``, ``closed``.
    """

    def __init__(self, opener: Callable[[], Any], size: int, what: str, url: str) -> None:
        self._opener = opener
        self._size = int(size)
        self._what = what
        self._url = url
        self._fh: Any = None
        self._pos = 0
        self.closed = False
        self.mode = "rb"
        self.name = url

    # pyarrow / io protocol ----------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            pos = offset
        elif whence == 1:
            pos = self._pos + offset
        elif whence == 2:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _handle(self) -> Any:
        if self._fh is None:
            self._fh = self._opener()
        return self._fh

    def _read_at(self, pos: int, n: int) -> bytes:
        def once() -> bytes:
            try:
                fh = self._handle()
                if fh.tell() != pos:
                    fh.seek(pos)
                return fh.read(n)
            except Exception:
                self._drop()
                raise

        return call(self._what, self._url, once)

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed file")
        left = self._size - self._pos
        want = left if n is None or n < 0 else min(n, left)
        if want <= 0:
            return b""
        parts: list[bytes] = []
        got = 0
        while got < want:
            chunk = self._read_at(self._pos + got, want - got)
            if not chunk:  # the file ended before its size said it would: the store changed under us
                raise OSError(errno.EIO, f"{self._url} ended at {self._pos + got} of {self._size} bytes")
            parts.append(chunk)
            got += len(chunk)
        self._pos += got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def _drop(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except Exception:  # a broken connection may fail to close: it is gone either way
                pass

    def close(self) -> None:
        self._drop()
        self.closed = True

    def __enter__(self) -> "ResumableReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["ENV_STORE_RETRY_S", "single_attempt", "single_attempt_options", "classify", "kind_of", "call", "budget_s", "limited", "retry_counts", "reset_counts",
           "ResumableReader", "TRANSIENT", "PERMANENT"]
