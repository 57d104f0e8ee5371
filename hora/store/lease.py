"""Leases in the Store: which materialization attempts of a dataset are alive, and which one commits.

Every attempt of :func:`hora.store.materialize` keeps one lease file fresh,
``datasets/<fingerprint>/_lease-<attempt>.json`` (a heartbeat thread rewrites it every
``ttl / 4`` seconds with the writer's wall-clock time). A lease whose heartbeat is older
than its ``ttl`` belongs to a writer that died: its staging folder ``_tmp-<attempt>`` and
the lease itself may be swept by anyone. A live attempt's files are never touched.

Three uses, all built on atomic single-file writes and listings that see every completed
write (local disks, HDFS, S3, GCS, Azure):

* :meth:`Lease.wait_for_older` lets a second materialization of the same dataset wait
  for an older live attempt to commit (then it reuses that commit) or to die.
* :meth:`Lease.commit_lock` makes commits exclusive. An attempt sets its lease's phase to
  ``committing`` and lists the leases; it proceeds only when a listing made *after* that
  write shows no other live committer. Two attempts can never both see that (each one's
  listing would have to precede the other's write, and each write precedes its own
  listing). Of two committers that see each other, the younger steps back until the
  older is done.
* :func:`sweep_dead` removes what dead attempts left.

A writer on the same machine (same boot, same PID namespace) that no longer exists is
dead at once, whatever its heartbeat says, so a crashed notebook kernel does not hold
up the next fit for a whole ttl. Clocks: expiry compares the writer's heartbeat time
with the reader's clock, so hosts whose clocks differ by more than the ttl can take a
live lease for a dead one; the default ttl (60 s, ``HORA_MATERIALIZE_LEASE_TTL``)
leaves room for that.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from hora import settings
from hora.errors import StoreError
from hora.pids import pid_alive
from hora.store.layout import LEASE_PREFIX, TMP_PREFIX
from hora.store.store import Store

logger = logging.getLogger(__name__)

ENV_LEASE_TTL = "HORA_MATERIALIZE_LEASE_TTL"
ENV_WAIT_TIMEOUT = "HORA_MATERIALIZE_WAIT_TIMEOUT"
DEFAULT_LEASE_TTL = settings.default(ENV_LEASE_TTL)
DEFAULT_WAIT_TIMEOUT = settings.default(ENV_WAIT_TIMEOUT)
POLL_INTERVAL = 0.5


def _machine() -> str:
    """This process's machine as far as PIDs go: host name, boot and PID namespace."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(open(path).read().strip() if path.endswith("boot_id") else os.readlink(path))
        except OSError:
            parts.append("?")
    return "|".join(parts)


MACHINE = _machine()


@dataclass(frozen=True)
class LeaseInfo:
    """What one lease file says."""

    attempt: str
    started_at: float
    heartbeat_at: float
    ttl: float
    phase: str
    host: str
    pid: int
    machine: str = ""

    @property
    def key(self) -> tuple[float, str]:
        """Older attempts sort first (ties broken by the attempt id)."""
        return (self.started_at, self.attempt)

    def alive(self, now: float | None = None) -> bool:
        """True while the heartbeat is younger than the ttl and, for a writer of this machine, its process lives."""
        if (time.time() if now is None else now) - self.heartbeat_at > self.ttl:
            return False
        if self.machine == MACHINE and self.pid > 0 and self.pid != os.getpid():
            return pid_alive(self.pid)
        return True


def read_leases(store: Store, fingerprint: str) -> dict[str, LeaseInfo]:
    """Every readable lease of a dataset, by attempt."""
    out: dict[str, LeaseInfo] = {}
    for entry in store.listdir(store.layout.dataset_dir(fingerprint)):
        base = entry.rsplit("/", 1)[-1]
        if not (base.startswith(LEASE_PREFIX) and base.endswith(".json")):
            continue
        try:
            raw = json.loads(store.read_bytes(entry))
            info = LeaseInfo(
                attempt=str(raw["attempt"]), started_at=float(raw["started_at"]),
                heartbeat_at=float(raw["heartbeat_at"]), ttl=float(raw["ttl"]), phase=str(raw["phase"]),
                host=str(raw.get("host", "?")), pid=int(raw.get("pid", 0)), machine=str(raw.get("machine", "")),
            )
        except (StoreError, ValueError, KeyError, TypeError) as exc:  # vanished or half-legible: skip it
            logger.debug("ignoring lease %s: %s", entry, exc)
            continue
        out[info.attempt] = info
    return out


def sweep_dead(store: Store, fingerprint: str, keep: str | None = None) -> list[str]:
    """Remove the staging folders and leases of attempts whose lease expired or is missing.

    ``keep`` (an attempt id) is never removed. Returns the attempts swept.
    """
    layout = store.layout
    leases = read_leases(store, fingerprint)
    now = time.time()
    swept = []
    for entry in store.listdir(layout.dataset_dir(fingerprint)):
        base = entry.rsplit("/", 1)[-1]
        if base.startswith(TMP_PREFIX):
            attempt = base[len(TMP_PREFIX):]
        elif base.startswith(LEASE_PREFIX) and base.endswith(".json"):
            attempt = base[len(LEASE_PREFIX):-len(".json")]
        else:
            continue
        lease = leases.get(attempt)
        if attempt == keep or (lease is not None and lease.alive(now)):
            continue
        logger.info("materialize: removing %s of attempt %s (%s)", store.url_for(entry), attempt,
                    "its writer is gone" if lease is not None else "it has no lease")
        store.rm(entry, recursive=True)
        swept.append(attempt)
    return sorted(set(swept))


class Lease:
    """The lease of one live materialization attempt (written at once, heartbeated until :meth:`release`).

    Args:
        store: the store.
        fingerprint: the dataset.
        attempt: this attempt's id.
        ttl: seconds without a heartbeat after which others take the attempt for dead
            (default ``HORA_MATERIALIZE_LEASE_TTL`` or 60).
    """

    def __init__(self, store: Store, fingerprint: str, attempt: str, ttl: float | None = None) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.attempt = attempt
        self.ttl = settings.get(ENV_LEASE_TTL) if ttl is None else float(ttl)
        self.path = store.layout.lease_path(fingerprint, attempt)
        self.started_at = time.time()
        self.phase = "writing"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._beat, name=f"hora-lease-{attempt}", daemon=True)
        self._thread.start()

    @property
    def key(self) -> tuple[float, str]:
        return (self.started_at, self.attempt)

    def _write(self) -> None:
        with self._lock:
            body = {
                "attempt": self.attempt, "fingerprint": self.fingerprint, "started_at": self.started_at,
                "heartbeat_at": time.time(), "ttl": self.ttl, "phase": self.phase,
                "host": socket.gethostname(), "pid": os.getpid(), "machine": MACHINE,
            }
            self.store.write_bytes(self.path, json.dumps(body).encode("utf-8"))

    def _beat(self) -> None:
        interval = max(0.1, self.ttl / 4)
        while not self._stop.wait(interval):
            try:
                self._write()
            except Exception as exc:  # the next beat may succeed; others see a stale lease only after ttl
                logger.warning("materialize: could not refresh the lease of attempt %s: %s", self.attempt, exc)

    def set_phase(self, phase: str) -> None:
        """Record this attempt's phase (``writing``, ``waiting``, ``committing``) in its lease, now."""
        self.phase = phase
        self._write()

    def others(self) -> list[LeaseInfo]:
        """The live leases of the other attempts of this dataset."""
        now = time.time()
        return [info for attempt, info in read_leases(self.store, self.fingerprint).items()
                if attempt != self.attempt and info.alive(now)]

    def wait_for_older(self, committed, timeout: float | None = None):
        """Wait while an older live attempt of this dataset is at work.

        Args:
            committed: a callable returning the committed DatasetInfo, or None.
            timeout: seconds to wait at most (default ``HORA_MATERIALIZE_WAIT_TIMEOUT`` or 3600;
                0 never waits); then this attempt goes on and writes its own copy.

        Returns:
            the committed DatasetInfo once an older attempt committed, or None when this
            attempt should write (no older live attempt, they died, or the wait timed out).
        """
        timeout = settings.get(ENV_WAIT_TIMEOUT) if timeout is None else timeout
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            older = sorted((o for o in self.others() if o.key < self.key), key=lambda o: o.key)
            if not older:
                return committed()
            found = committed()
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                logger.warning(
                    "materialize: attempt %s (%s, pid %d) still writes dataset %s after %.0f s; writing another copy",
                    older[0].attempt, older[0].host, older[0].pid, self.fingerprint, timeout,
                )
                return None
            if not announced:
                logger.info("materialize: waiting for attempt %s (%s, pid %d) to commit dataset %s",
                            older[0].attempt, older[0].host, older[0].pid, self.fingerprint)
                self.set_phase("waiting")
                announced = True
            time.sleep(POLL_INTERVAL)

    @contextlib.contextmanager
    def commit_lock(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the dataset's commit exclusively among live attempts for the ``with`` block.

        Raises:
            StoreError: another live attempt kept committing for longer than ``timeout``
                (default: the wait timeout), named in the message.
        """
        timeout = settings.get(ENV_WAIT_TIMEOUT) if timeout is None else timeout
        deadline = time.monotonic() + max(timeout, 4 * self.ttl)

        def committing_rivals() -> list[LeaseInfo]:
            rivals = [o for o in self.others() if o.phase == "committing"]
            if rivals and time.monotonic() >= deadline:
                oldest = min(rivals, key=lambda o: o.key)
                self.set_phase("writing")
                raise StoreError(
                    f"dataset {self.fingerprint} in {self.store.url}: attempt {oldest.attempt} ({oldest.host}, pid "
                    f"{oldest.pid}) kept its commit for more than {timeout:.0f} s"
                )
            return rivals

        self.set_phase("committing")
        while True:
            rivals = committing_rivals()  # listed after this attempt's own "committing" write
            if not rivals:
                break
            if any(o.key < self.key for o in rivals):
                self.set_phase("waiting")  # the older attempt goes first
                while any(o.key < self.key for o in committing_rivals()):
                    time.sleep(POLL_INTERVAL)
                self.set_phase("committing")
            else:
                time.sleep(POLL_INTERVAL)  # only younger rivals: they step back
        try:
            yield
        finally:
            with contextlib.suppress(StoreError):
                self.set_phase("committed")

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self.store.rm(self.path)
        except StoreError as exc:  # an expired lease is swept by the next attempt anyway
            logger.warning("materialize: could not remove lease %s: %s", self.store.url_for(self.path), exc)


__all__ = ["Lease", "LeaseInfo", "read_leases", "sweep_dead", "ENV_LEASE_TTL", "ENV_WAIT_TIMEOUT"]
