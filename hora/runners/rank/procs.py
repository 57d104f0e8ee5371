"""Start, watch and stop a group of rank processes on this machine.

:class:`ProcessLauncher` is the one piece of process handling shared by ``hora run``,
the local launcher of :func:`hora.runners.run`, and the Spark/Dask task supervisors.
Every rank runs in its own session (process group), so stopping a rank stops whatever
it started too: SIGTERM to the group, then SIGKILL after a grace period. Each output
line is handed to a callback with its rank and stream, and optionally written to
``<output_dir>/rank.<r>/stdout|stderr``.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from hora import pids
from hora.errors import ConfigError
from hora.runners.rank.warm.client import WarmProcess

log = logging.getLogger(__name__)

LineCallback = Callable[[int, str, str], None]  # (rank, "stdout"|"stderr", line without newline)

_TRACEBACK_HEAD = "Traceback (most recent call last):"


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen | WarmProcess, tail_lines: int) -> None:
        self.rank = rank
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the rank leads its own group
        self.threads: list[threading.Thread] = []
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.files: list[IO[bytes]] = []


class ProcessLauncher:
    """Run one process per rank; forward their output line by line; stop them all.

    Args:
        on_line: called from reader threads with ``(rank, stream, line)`` for every line.
        output_dir: if given, each rank's output is also written to
            ``<output_dir>/rank.<r>/stdout`` and ``.../stderr``.
        tail_lines: how many trailing stderr lines to keep per rank (for error reports).
    """

    def __init__(self, on_line: LineCallback, output_dir: str | None = None, tail_lines: int = 400) -> None:
        self._on_line = on_line
        self._output_dir = output_dir
        self._tail_lines = tail_lines
        self._ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------------
    def start(
        self,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin_data: bytes | None = None,
        cwd: str | None = None,
        die_with_parent: bool = False,
        warm: Mapping[str, str] | None = None,
        warm_command: bool = False,
        exit_report: Mapping[str, str] | None = None,
    ) -> subprocess.Popen | WarmProcess:
        """Start ``argv`` as rank ``rank`` in a new session with exactly ``env``.

        ``die_with_parent``: Linux kills the rank (SIGKILL) when the thread that started it
        exits, so a supervisor that is killed leaves no rank behind.
        ``warm``: fork ``argv`` (``python -m MODULE ...``) from a warm server
        (:mod:`hora.runners.rank.warm.client`); the mapping holds the variables the rank sets before its
        imports (part of the server's key). A warm rank also dies with this process. When no
        server can start or answer, a plain subprocess starts (a logged warning).
        ``warm_command``: ``argv`` is a ``hora run`` command (``python SCRIPT ...`` too), forked
        with a fresh interpreter's semantics (:func:`hora.runners.rank.warm.client.spawn`).
        ``exit_report``: where the warm server posts that the rank exited when it ends the rank
        itself (this process gone): ``{"addr", "secret" (hex), "key"}`` of a driver service.

        Raises:
            ConfigError: the program cannot be started (not found, not executable).
        """
        if rank in self._ranks:
            raise ConfigError(f"rank {rank} was already started")
        proc: subprocess.Popen | WarmProcess | None = None
        if warm is not None:
            from hora.runners.rank.warm import client as warm_mod

            proc = warm_mod.spawn(argv, env, cwd, import_env=warm, stdin=stdin_data is not None,
                                  command=warm_command, exit_report=exit_report)
        if proc is None:
            proc = self._popen(rank, argv, env, stdin_data, cwd, die_with_parent)
            if die_with_parent:
                _guard().add(proc.pid)
        self._watch(rank, proc, stdin_data)
        return proc

    @staticmethod
    def _popen(rank: int, argv: Sequence[str], env: Mapping[str, str], stdin_data: bytes | None, cwd: str | None,
               die_with_parent: bool) -> subprocess.Popen:
        try:
            return subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                preexec_fn=pids.die_with_parent if die_with_parent and sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            raise ConfigError(f"cannot start rank {rank}: {argv[0]!r}: {exc.strerror or exc}") from exc

    def _watch(self, rank: int, proc: subprocess.Popen | WarmProcess, stdin_data: bytes | None) -> None:
        entry = _Rank(rank, proc, self._tail_lines)
        files: dict[str, IO[bytes] | None] = {"stdout": None, "stderr": None}
        if self._output_dir:
            rank_dir = os.path.join(self._output_dir, f"rank.{rank}")
            os.makedirs(rank_dir, exist_ok=True)
            for name in files:
                fh = open(os.path.join(rank_dir, name), "wb")  # noqa: SIM115 (closed by the reader)
                files[name] = fh
                entry.files.append(fh)
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            t = threading.Thread(
                target=self._pump,
                args=(entry, name, stream, files[name]),
                name=f"hora-rank{rank}-{name}",
                daemon=True,
            )
            t.start()
            entry.threads.append(t)
        if stdin_data is not None:
            t = threading.Thread(target=self._feed, args=(proc, stdin_data), name=f"hora-rank{rank}-stdin", daemon=True)
            t.start()
        with self._lock:
            self._ranks[rank] = entry
        log.debug("started rank %d: pid %d%s", rank, proc.pid, " (warm)" if isinstance(proc, WarmProcess) else "")

    @staticmethod
    def _feed(proc: subprocess.Popen | WarmProcess, data: bytes) -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the process exited before reading its input; its exit code tells why

    def _pump(self, entry: _Rank, name: str, stream: IO[bytes], fh: IO[bytes] | None) -> None:
        try:
            for raw in iter(stream.readline, b""):
                if fh is not None:
                    try:
                        fh.write(raw)
                        fh.flush()
                    except OSError:
                        pass
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if name == "stderr":
                    entry.stderr_tail.append(line)
                try:
                    self._on_line(entry.rank, name, line)
                except Exception:  # a broken sink must not stop the pump (the pipe would fill)
                    log.exception("output callback failed for rank %d", entry.rank)
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass

    # ----------------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        """The ranks started so far."""
        with self._lock:
            return sorted(self._ranks)

    def pid(self, rank: int) -> int:
        """The process id of a rank."""
        return self._ranks[rank].proc.pid

    def poll(self) -> dict[int, int | None]:
        """Exit code of each rank (``None`` while running; ``-N`` when killed by signal N)."""
        with self._lock:
            entries = list(self._ranks.values())
        return {e.rank: e.proc.poll() for e in entries}

    def alive(self) -> list[int]:
        """Ranks whose process is still running."""
        return [r for r, code in self.poll().items() if code is None]

    def wait_output(self, rank: int, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until the output of an exited rank is fully read."""
        deadline = time.monotonic() + timeout
        for t in self._ranks[rank].threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def stderr_tail(self, rank: int) -> list[str]:
        """The last stderr lines of a rank."""
        return list(self._ranks[rank].stderr_tail)

    def traceback_of(self, rank: int) -> str | None:
        """The last Python traceback a rank wrote to stderr, or its stderr tail, or None."""
        return last_traceback(self.stderr_tail(rank))

    def terminate(self, grace: float = 5.0, ranks: Sequence[int] | None = None) -> None:
        """Stop ranks (default all): SIGTERM to each process group, SIGKILL after ``grace`` s.

        Groups are killed even when their leader already exited, so no child of a rank
        outlives this call. Never raises for processes that are already gone.
        """
        with self._lock:
            entries = [e for r, e in self._ranks.items() if ranks is None or r in ranks]
        live = [e for e in entries if e.proc.poll() is None]
        for e in live:
            _killpg(e.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(e.proc.poll() is None for e in live):
            time.sleep(0.05)
        for e in entries:
            _killpg(e.pgid, signal.SIGKILL)
        if _GUARD is not None:
            _GUARD.remove([e.pgid for e in entries])
        for e in entries:
            try:
                e.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("rank %d (pid %d) did not exit after SIGKILL", e.rank, e.proc.pid)
        for e in entries:
            for t in e.threads:
                t.join(timeout=2)


# The group guard: a process that outlives this one. ``die_with_parent`` makes Linux kill a
# rank when this process dies, but not what the rank started (its process group: a user's
# subprocess, a data loader's workers), and a SIGKILLed launcher runs no cleanup. The guard
# reads "+<pgid>" / "-<pgid>" lines on a pipe whose only writer is this process; at EOF (this
# process ended, however) it stops the groups still registered as terminate() would: SIGTERM,
# then SIGKILL after the grace. Stdlib only, started without site (-S): it costs ~20 ms once.
_GUARD_CODE = r"""
import os, signal, sys, time
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
live = [g for g in groups if alive(g)]
for g in live:
    try:
        os.killpg(g, signal.SIGTERM)
    except OSError:
        pass
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline and any(alive(g) for g in live):
    time.sleep(0.05)
for g in live:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""
#: seconds between the guard's SIGTERM and SIGKILL to the groups of a launcher that died
GUARD_GRACE = 3.0


class _GroupGuard:
    """This process's group guard (see ``_GUARD_CODE``); registering never raises: without a
    guard (it could not start, or died) a rank still dies with this process, its group may not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        try:
            self._proc = subprocess.Popen([sys.executable, "-S", "-c", _GUARD_CODE, str(GUARD_GRACE)],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError as exc:
            log.warning("could not start the group guard (a rank's children may outlive a killed launcher): %s", exc)

    def _send(self, lines: list[str]) -> None:
        if self._proc is None or self._proc.stdin is None or not lines:
            return
        with self._lock:
            try:
                self._proc.stdin.write("".join(f"{line}\n" for line in lines).encode())
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:
                log.warning("the group guard is gone (a rank's children may outlive a killed launcher): %s", exc)
                self._proc = None

    def add(self, pgid: int) -> None:
        self._send([f"+{pgid}"])

    def remove(self, pgids: Sequence[int]) -> None:
        self._send([f"-{g}" for g in pgids])


_GUARD: _GroupGuard | None = None
_GUARD_LOCK = threading.Lock()


def _guard() -> _GroupGuard:
    global _GUARD
    with _GUARD_LOCK:
        if _GUARD is None or (_GUARD._proc is not None and _GUARD._proc.poll() is not None):
            _GUARD = _GroupGuard()
        return _GUARD


def last_traceback(lines: Sequence[str]) -> str | None:
    """The last Python traceback in ``lines`` (a stderr tail), else its last 40 lines, None if empty."""
    if not lines:
        return None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(_TRACEBACK_HEAD):
            return "\n".join(lines[i:])
    return "\n".join(lines[-40:])


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int) -> str:
    """``'exit code 3'`` or ``'signal 9 (SIGKILL)'`` for a Popen return code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"signal {-code} ({name})"
    return f"exit code {code}"


def shell_exit_code(code: int) -> int:
    """A Popen return code as a shell would report it (128 + N for signal N)."""
    return 128 - code if code < 0 else code


__all__ = ["ProcessLauncher", "describe_exit", "shell_exit_code", "last_traceback"]
