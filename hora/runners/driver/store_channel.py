"""The driver service through the Store, for clients the executors cannot reach (Spark Connect).

With a classic session, or a Connect client the executors can connect to, the ranks
report to the client's :class:`~hora.runners.driver.service.DriverService` over TCP. A Spark
Connect client may sit outside the cluster (a laptop, a notebook behind NAT), where no
executor can open a connection to it. Then the run's reports travel through the Store,
which both sides reach:

* **Relay** (:class:`StoreRelay`, in rank 0's barrier task): rank 0's rendezvous server
  on the executors doubles as the ranks' driver service (they report ``started``,
  heartbeats, output, metrics, failures, ``done`` and ``exited`` to it, exactly as to the
  client's). Every :data:`POLL_INTERVAL` the relay drains the output batches into a new
  ``log-<n>`` file and writes the latest of every other report as one ``state`` file, in
  ``<store>/runs/<run_id>/channel/``. Each file is written atomically and signed with the
  job's secret (HMAC-SHA256), so the client unpickles only what this job's ranks wrote.
* **Mirror** (:class:`StoreMirror`, on the client): polls those files and replays them
  into the client's own DriverService, whose progress bar, rank output, store logs and
  monitor then work unchanged. The client's abort (``runner/abort``) is written as an
  ``abort`` file; the relay sets it for the ranks.

A rank whose process failed waits (briefly) until the relay has mirrored its failure
report before its task fails, so the client sees the rank's own error and traceback
even though Spark then kills rank 0's task and with it the relay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import pickle
import threading
import time
from typing import Any

from hora.errors import HoraError, StoreError
from hora.native import keys
from hora.native.rendezvous import KVClient, RendezvousServer

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5  # seconds between the relay's (and the mirror's) looks
STATE_EVERY = 1.0  # seconds between state writes when only heartbeats moved
MIRROR_WAIT = 15.0  # seconds a failed rank waits for the relay to mirror its report

#: the reports mirrored as the latest value of each key (output batches go as log files)
MIRRORED = (keys.STARTED, keys.HEARTBEAT, keys.METRICS, keys.FAILED, keys.DONE, keys.EXITED)
#: set by the relay in its own server once ``state`` holds rank r's failure report and exit
ACKED = "runner/mirrored/"


@dataclasses.dataclass(frozen=True)
class StoreChannel:
    """Where one run's reports go: the Store and the run (picklable; travels in the task).

    Attributes:
        store: the :class:`hora.store.Store` both the client and the executors reach.
        run_id: the run (names its folder).
    """

    store: Any
    run_id: str

    @property
    def folder(self) -> str:
        """``<store>/runs/<run_id>/channel``."""
        return self.store.layout.channel_dir(self.run_id)

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def log_name(self, n: int) -> str:
        return self.path(f"log-{n:09d}")


def _seal(secret: bytes, obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return hmac.new(secret, body, hashlib.sha256).digest() + body


def _open(secret: bytes, data: bytes, where: str) -> Any:
    """Unpickle a sealed file after checking its HMAC.

    Raises:
        StoreError: the file was not written by this job (wrong or missing signature).
    """
    mac, body = data[:32], data[32:]
    if len(data) < 32 or not hmac.compare_digest(mac, hmac.new(secret, body, hashlib.sha256).digest()):
        raise StoreError(f"{where} is not signed by this run's secret; ignoring it")
    return pickle.loads(body)  # only after the HMAC check


class _Poller:
    """A background thread that runs ``sync()`` every :data:`POLL_INTERVAL` (the relay's and the mirror's)."""

    role = "poller"

    def __init__(self, server: RendezvousServer, channel: StoreChannel, secret: bytes) -> None:
        self.server = server
        self.channel = channel
        self.secret = secret
        self._next_log = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"hora-{self.role}-{channel.run_id}", daemon=True)

    def sync(self) -> None:  # pragma: no cover - each side has its own
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            try:
                self.sync()
            except Exception as exc:  # the store may hiccup; the next round tries again
                log.warning("hora %s of run %s: %s", self.role, self.channel.run_id, exc)

    def _finish(self) -> None:
        """Stop the thread after a last round."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self.sync()
        except Exception as exc:
            log.warning("hora %s of run %s: the last round failed: %s", self.role, self.channel.run_id, exc)


class StoreRelay(_Poller):
    """Rank 0's side: mirror the ranks' reports from ``server`` into the Store (a background thread).

    Raises (from the constructor):
        StoreError: the executors cannot write the channel folder.
    """

    role = "relay"

    def __init__(self, server: RendezvousServer, channel: StoreChannel, secret: bytes) -> None:
        super().__init__(server, channel, secret)
        self._state: dict[str, bytes] = {}
        self._acked: set[int] = set()
        self._written_at = 0.0
        self._aborted = False
        host, port = server.address
        self._client = KVClient(f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}", secret, timeout=10.0)
        channel.store.write_bytes(channel.path("relay"), _seal(secret, {"started": time.time()}))
        self._thread.start()

    def _drain_logs(self) -> list[tuple[int, int, bytes]]:
        batches = []
        for key in self.server.keys(keys.LOG):
            parsed = keys.parse_log_key(key)
            if parsed is None:
                continue
            try:
                (raw,) = self.server.wait([key], 0.01)
            except HoraError:
                continue
            batches.append((parsed[0], parsed[1], raw))
            self._client.delete(key)
        return batches

    def sync(self) -> None:
        """One round: new output as a log file, changed reports as the state file, the client's abort."""
        batches = self._drain_logs()
        if batches:
            self.channel.store.write_bytes(self.channel.log_name(self._next_log), _seal(self.secret, batches))
            self._next_log += 1
        state: dict[str, bytes] = {}
        for prefix in MIRRORED:
            for key in self.server.keys(prefix):
                try:
                    state[key] = self.server.wait([key], 0.01)[0]
                except HoraError:
                    continue
        if keys.FAILSEQ in self.server.keys(keys.FAILSEQ):
            state[keys.FAILSEQ] = self.server.wait([keys.FAILSEQ], 0.01)[0]
        if state != self._state:
            moved = {k for k in state if state.get(k) != self._state.get(k)}
            beats_only = all(k.startswith(keys.HEARTBEAT) or k.startswith(keys.METRICS) for k in moved)
            now = time.monotonic()
            if not beats_only or now - self._written_at >= STATE_EVERY:
                self.channel.store.write_bytes(self.channel.path("state"), _seal(self.secret, state))
                self._state, self._written_at = state, now
                for key in state:
                    rank = keys.rank_of(keys.FAILED, key)
                    if rank is not None and rank not in self._acked and keys.rank_key(keys.EXITED, rank) in state:
                        self._acked.add(rank)
                        self.server.set(keys.rank_key(ACKED, rank), b"1")
        if not self._aborted and self.channel.store.exists(self.channel.path("abort")):
            self._aborted = True
            log.warning("hora relay of run %s: the client aborted the run", self.channel.run_id)
            self.server.set(keys.ABORT, b"1")

    def close(self) -> None:
        """Stop the thread after a last round (everything the ranks reported reaches the Store)."""
        try:
            self._finish()
        finally:
            self._client.close()


def wait_mirrored(addr: str, secret: bytes, rank: int, timeout: float = MIRROR_WAIT) -> bool:
    """Wait until the relay has put rank ``rank``'s failure report in the Store; False if it did not in time."""
    client = KVClient(addr, secret, timeout=min(timeout, 10.0))
    try:
        client.wait([keys.rank_key(ACKED, rank)], timeout)
        return True
    except HoraError:
        return False
    finally:
        client.close()


class StoreMirror(_Poller):
    """The client's side: replay the relay's files into ``server`` (the DriverService's), forward its abort.

    Args:
        server: the client's :class:`~hora.runners.driver.service.DriverService` server.
        channel: the run's channel.
        secret: the job secret (checks each file's signature).
    """

    role = "mirror"

    def __init__(self, server: RendezvousServer, channel: StoreChannel, secret: bytes) -> None:
        super().__init__(server, channel, secret)
        self._seen_state: bytes | None = None
        self._abort_sent = False
        self._lock = threading.Lock()
        self._thread.start()

    def sync(self) -> None:
        """One round: new log files, the latest state, and the client's abort."""
        with self._lock:
            store = self.channel.store
            while store.exists(self.channel.log_name(self._next_log)):
                where = store.url_for(self.channel.log_name(self._next_log))
                batches = _open(self.secret, store.read_bytes(self.channel.log_name(self._next_log)), where)
                for rank, seq, raw in batches:
                    self.server.set(keys.log_key(rank, seq), raw)
                self._next_log += 1
            state_path = self.channel.path("state")
            if store.exists(state_path):
                raw_state = store.read_bytes(state_path)
                if raw_state != self._seen_state:
                    state = _open(self.secret, raw_state, store.url_for(state_path))
                    self._seen_state = raw_state
                    for key, value in state.items():
                        if key == keys.FAILSEQ:  # keep the client's own counter ahead of the ranks'
                            local = self.server.keys(keys.FAILSEQ)
                            mine = int(self.server.wait([keys.FAILSEQ], 0.01)[0]) if local else 0
                            if int(value) > mine:
                                self.server.set(keys.FAILSEQ, value)
                        else:
                            self.server.set(key, value)
            if not self._abort_sent and self.server.keys(keys.ABORT):
                self._abort_sent = True
                store.write_bytes(self.channel.path("abort"), b"1")

    def close(self) -> None:
        """Stop polling after a last round, and remove the channel's files (the run logs are kept elsewhere)."""
        self._finish()
        try:
            self.channel.store.rm(self.channel.folder, recursive=True)
        except StoreError as exc:
            log.debug("could not remove %s: %s", self.channel.folder, exc)


__all__ = ["StoreChannel", "StoreRelay", "StoreMirror", "wait_mirrored", "POLL_INTERVAL"]
