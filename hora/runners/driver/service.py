"""The driver side of a run: a small authenticated service the ranks report to.

:class:`DriverService` hosts a :class:`~hora.native.rendezvous.RendezvousServer` whose
address travels in the :class:`~hora.runners.spec.LaunchSpec`. Ranks (or the task
supervisors on Spark executors and Dask workers) push to it:

* ``runner/started/<r>`` when a rank's process is up,
* ``runner/hb/<r>`` heartbeats,
* ``runner/log/<r>/<seq>`` batches of output lines,
* ``runner/metrics/<r>`` the latest metrics of :func:`hora.runners.report`,
* ``runner/failed/<r>`` a :class:`~hora.runners.spec.FailureReport` (numbered by the
  failure counter, so the monitor reports the *first* failure),
* ``runner/result/<r>`` the value of ``fn`` of a rank on another host (in chunks),
* ``runner/done/<r>`` when ``fn`` returned.

Every key name comes from :mod:`hora.native.keys`.

A thread on the driver polls it, prints output lines prefixed by rank, renders the
progress bar and keeps the lines for the Store's run logs. The driver sets
``runner/abort`` to tell every rank to stop.
"""

from __future__ import annotations

import logging
import pickle
import sys
import threading
import time
from typing import IO, Any

from hora.errors import WorkerFailedError
from hora.native import keys
from hora.native.rendezvous import tls as _tls
from hora.native.rendezvous import KVClient, RendezvousServer
from hora.native.rendezvous.tls import JobCertificate
from hora.runners.driver.progress import Progress
from hora.runners.spec import FailureReport

log = logging.getLogger(__name__)
out_log = logging.getLogger("hora.runners.output")

POLL_INTERVAL = 0.2
MAX_KEPT_LINES = 200_000  # per rank, for the store's run logs


class _View:
    """What the ranks reported, kept up to date from the server's change log: each
    :meth:`refresh` reads only the keys written since the last one (a sequence number),
    never every rank's keys."""

    def __init__(self, server: RendezvousServer) -> None:
        self.server = server
        self.seq = 0
        self.lock = threading.Lock()
        self.started: dict[int, bytes] = {}
        self.done: set[int] = set()
        self.exited: set[int] = set()
        self.failed: dict[int, FailureReport | None] = {}
        # when a rank's heartbeat last moved (or it started), oldest first: the silent ranks lead
        self.beat_at: dict[int, float] = {}
        self.hosts: dict[int, str] | None = None  # started, decoded (None: to rebuild)
        self.metrics: dict[int, bytes] = {}
        self.metrics_moved: set[int] = set()
        self.logs: dict[str, bytes] = {}  # output batches not yet printed
        self.barriers: set[str] = set()

    def refresh(self) -> None:
        with self.lock:
            self.seq, changed = self.server.changes(self.seq)
            if not changed:
                return
            now = time.monotonic()
            for key, value in changed:
                if not key.startswith(keys.RUNNER):
                    if key.startswith(keys.BARRIER):
                        (self.barriers.add if value is not None else self.barriers.discard)(key)
                    continue
                if key.startswith(keys.HEARTBEAT):
                    rank = keys.rank_of(keys.HEARTBEAT, key)
                    if rank is not None:
                        self.beat_at.pop(rank, None)
                        self.beat_at[rank] = now
                elif key.startswith(keys.LOG):
                    if value is None:
                        self.logs.pop(key, None)
                    else:
                        self.logs[key] = value
                elif key.startswith(keys.METRICS):
                    rank = keys.rank_of(keys.METRICS, key)
                    if rank is not None and value is not None:
                        self.metrics[rank] = value
                        self.metrics_moved.add(rank)
                elif key.startswith(keys.STARTED):
                    rank = keys.rank_of(keys.STARTED, key)
                    if rank is not None and value is not None:
                        self.started[rank] = value
                        self.hosts = None
                        self.beat_at.setdefault(rank, now)
                elif key.startswith(keys.DONE):
                    rank = keys.rank_of(keys.DONE, key)
                    if rank is not None:
                        (self.done.add if value is not None else self.done.discard)(rank)
                elif key.startswith(keys.EXITED):
                    rank = keys.rank_of(keys.EXITED, key)
                    if rank is not None:
                        (self.exited.add if value is not None else self.exited.discard)(rank)
                elif key.startswith(keys.FAILED):
                    rank = keys.rank_of(keys.FAILED, key)
                    if rank is not None and value is not None:
                        self.failed[rank] = _report(value)


def _report(raw: bytes) -> FailureReport | None:
    try:
        report = pickle.loads(raw)
    except Exception:
        return None
    return report if isinstance(report, FailureReport) else None


class DriverService:
    """Serve the ranks of one run and collect what they report.

    Args:
        secret: the job secret.
        num_proc: the number of ranks.
        run_id: the run id (names the store log folder).
        bind: the address to listen on (port 0: no race).
        advertise: the address ranks use to reach the service.
        verbose: 0 prints nothing, 1 prints rank output and the progress bar.
        store: a :class:`hora.store.Store`; rank output is saved to its run logs.
        stdout, stderr: where rank output is printed (default: ``sys.stdout`` / ``sys.stderr``
            at the time of printing).
        timestamps: prefix every printed line with the time it arrived.
        attempt: which attempt of the run this service serves (1 = the first launch);
            later attempts save their logs as ``rank.<r>.attempt<k>.log``.
        label: shown after the run id in the progress bar (``"attempt 2 of 3"``).
        tls: serve in TLS with a fresh certificate of this attempt (:attr:`tls`, for the
            launch spec); None: ``HORA_TLS``. Raises ConfigError without ``cryptography``.
    """

    def __init__(
        self,
        secret: bytes,
        num_proc: int,
        run_id: str,
        *,
        bind: str = "127.0.0.1",
        advertise: str = "127.0.0.1",
        verbose: int = 1,
        store: Any = None,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
        timestamps: bool = False,
        attempt: int = 1,
        label: str | None = None,
        tls: bool | None = None,
    ) -> None:
        self._secret = secret
        #: this attempt's TLS certificate and key (None: plaintext), filed under the secret, so
        #: that every server and client of the job in this process uses it
        self.tls: JobCertificate | None = None
        if _tls.enabled(tls):
            self.tls = _tls.make_job_certificate(run_id, hosts=tuple(dict.fromkeys((advertise, bind))))
            _tls.register(secret, self.tls)
        self.num_proc = num_proc
        self.attempt = attempt
        self._stdout, self._stderr, self._timestamps = stdout, stderr, timestamps
        self.run_id = run_id
        self.verbose = verbose
        self.store = store
        self.server = RendezvousServer(secret, host=bind, port=0)
        self.server.start()
        port = self.server.addr.rpartition(":")[2]
        self.addr = f"{advertise}:{port}"
        local = "127.0.0.1" if bind in ("0.0.0.0", "", "127.0.0.1", "localhost") else bind
        self._client = KVClient(f"{local}:{port}", secret, timeout=10.0)
        self.progress = Progress(run_id, enabled=verbose >= 1, label=label, stream=self._stderr)
        self._lines: dict[int, list[str]] = {r: [] for r in range(num_proc)}
        self._dropped: dict[int, int] = {r: 0 for r in range(num_proc)}
        self._log_seq: dict[int, int] = {r: 0 for r in range(num_proc)}
        self._metric_seq: dict[int, int] = {}
        self._view = _View(self.server)
        self._out_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"hora-driver-{run_id}", daemon=True)
        self._thread.start()

    # output -----------------------------------------------------------------------------
    def _print(self, text: str, stream: str) -> None:
        if self._timestamps:
            text = time.ctime() + text  # horovodrun --prefix-output-with-timestamp
        out = (self._stderr or sys.stderr) if stream == "stderr" else (self._stdout or sys.stdout)
        try:
            self.progress.write(text, out)
        except (OSError, ValueError):
            pass  # a closed terminal must not stop the run

    def emit(self, rank: int, stream: str, line: str) -> None:
        """Forward one output line of a rank: print it prefixed (verbose >= 1), keep it for the store."""
        text = f"[{rank}]<{stream}>:{line}"
        with self._out_lock:
            kept = self._lines.setdefault(rank, [])
            if len(kept) < MAX_KEPT_LINES:
                kept.append(f"<{stream}>:{line}")
            else:
                self._dropped[rank] = self._dropped.get(rank, 0) + 1
            out_log.debug("%s", text)
            if self.verbose >= 1:
                self._print(text, stream)

    def emit_host(self, host: str, stream: str, line: str) -> None:
        """Print a line that belongs to a host, not a rank (ssh's messages, a login banner)."""
        with self._out_lock:
            out_log.debug("[%s]<%s>:%s", host, stream, line)
            if self.verbose >= 1:
                self._print(f"[{host}]<{stream}>:{line}", stream)

    def lines(self, rank: int) -> list[str]:
        """The lines kept so far for ``rank`` (``<stream>:line``)."""
        with self._out_lock:
            return list(self._lines.get(rank, []))

    # polling ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            try:
                self.poll_once()
            except Exception:  # the poller must keep going; the run's own checks decide failure
                log.debug("driver poll failed", exc_info=True)

    def poll_once(self) -> None:
        """Drain pending log batches and metrics (also called once at the end)."""
        view = self._view
        view.refresh()
        with view.lock:
            batches = sorted((parsed, key, raw) for key, raw in view.logs.items()
                             if (parsed := keys.parse_log_key(key)) is not None)
            view.logs.clear()
            metrics = {r: view.metrics[r] for r in view.metrics_moved}
            view.metrics_moved.clear()
        for (rank, _), key, raw in batches:
            try:
                batch = pickle.loads(raw)
            except Exception:
                continue
            for stream, line in batch:
                self.emit(rank, stream, line)
            self.server.delete(key)
        for rank, raw in sorted(metrics.items()):
            try:
                seq, values = pickle.loads(raw)
            except Exception:
                continue
            if self._metric_seq.get(rank) != seq:
                self._metric_seq[rank] = seq
                with self._out_lock:
                    self.progress.update(rank, values)

    # state --------------------------------------------------------------------------------
    def started(self) -> dict[int, str]:
        """Ranks whose process is up, with their host."""
        view = self._view
        view.refresh()
        with view.lock:
            if view.hosts is None:
                view.hosts = {r: v.decode(errors="replace") for r, v in view.started.items()}
            return dict(view.hosts)

    def done(self) -> set[int]:
        """Ranks whose ``fn`` returned."""
        self._view.refresh()
        with self._view.lock:
            return set(self._view.done)

    def failures(self) -> list[FailureReport]:
        """Failure reports posted by ranks, first failure first."""
        self._view.refresh()
        with self._view.lock:
            reports = [r for r in self._view.failed.values() if r is not None]
        return sorted(reports, key=lambda r: r.seq)

    def barrier_keys(self) -> list[str]:
        """The barrier keys ranks have set (``barrier/<name>/<rank>``)."""
        self._view.refresh()
        with self._view.lock:
            return sorted(self._view.barriers)

    def stale_heartbeats(self, timeout: float, ignore: set[int]) -> list[int]:
        """Started ranks (not in ``ignore``) whose heartbeat has not moved for ``timeout`` s.

        Silence is measured up to the last turn of the server's event loop: while the
        service itself is stuck (a slow request), the beats waiting in its sockets count as
        sent, and no rank is reported lost for the service's delay.
        """
        view = self._view
        view.refresh()
        now = min(time.monotonic(), self.server.last_turn + 0.25)
        stale = []
        with view.lock:
            started = view.started
            for rank, at in view.beat_at.items():  # oldest beat first: stop at the first recent one
                if now - at <= timeout:
                    break
                if rank in started and rank not in ignore:
                    stale.append(rank)
        return sorted(stale)

    def exited(self) -> set[int]:
        """Ranks whose supervisor (Spark/Dask task) has stopped its processes."""
        self._view.refresh()
        with self._view.lock:
            return set(self._view.exited)

    def wait_exited(self, ranks: set[int], timeout: float) -> set[int]:
        """Wait up to ``timeout`` s until the supervisors of ``ranks`` report their processes gone;
        return the ranks that did not."""
        deadline = time.monotonic() + timeout
        while True:
            left = ranks - self.exited()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    def abort(self) -> None:
        """Tell every rank to stop."""
        self.server.set(keys.ABORT, b"1")

    def next_seq(self) -> int:
        """A number from the failure counter: stamps a failure the launcher itself observed
        (ranks number their own reports from the same counter)."""
        return self._client.add(keys.FAILSEQ, 1)

    def result(self, rank: int, timeout: float = 30.0) -> Any:
        """The value a rank on another host posted (:func:`hora.runners.rank.main.post_result`).

        Raises:
            WorkerFailedError: it never arrived within ``timeout`` seconds.
        """
        import cloudpickle

        from hora.errors import RendezvousError

        try:
            (count,) = self.server.wait([keys.rank_key(keys.RESULT, rank)], timeout)
            chunks = self.server.wait([keys.result_chunk_key(rank, i) for i in range(int(count))], timeout)
        except RendezvousError as exc:
            raise WorkerFailedError(f"rank {rank} exited without posting its result: {exc}", rank=rank) from None
        return cloudpickle.loads(b"".join(chunks))

    # end ----------------------------------------------------------------------------------
    def save_logs(self) -> None:
        """Write each rank's lines to ``<store>/runs/<run_id>/logs/rank.<r>.log`` (if a store was given;
        ``rank.<r>.attempt<k>.log`` for the k-th attempt of a relaunched run)."""
        if self.store is None:
            return
        try:
            logs_dir = self.store.layout.logs_dir(self.run_id)
            with self._out_lock:
                snapshot = {r: list(lines) for r, lines in self._lines.items()}
                dropped = dict(self._dropped)
            for rank, lines in sorted(snapshot.items()):
                text = "\n".join(lines) + ("\n" if lines else "")
                if dropped.get(rank):
                    text += f"<hora>:{dropped[rank]} further lines were dropped\n"
                suffix = "" if self.attempt == 1 else f".attempt{self.attempt}"
                self.store.write_bytes(f"{logs_dir}/rank.{rank}{suffix}.log", text.encode())
        except Exception as exc:  # logs are a convenience; never mask the run's own outcome
            log.warning("could not save the run logs of %s to the store: %s", self.run_id, exc)

    def close(self) -> None:
        """Drain what is left, close the progress bar, save logs and stop the server."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.poll_once()
        except Exception:
            log.debug("final driver poll failed", exc_info=True)
        self.progress.close()
        self.save_logs()
        self._client.close()
        self.server.stop()
        if self.tls is not None:
            _tls.forget(self._secret)


__all__ = ["DriverService"]
