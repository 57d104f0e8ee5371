"""This host's processes: liveness (the runners' rank supervisors, the store's lease owners),
dying with one's parent (``PR_SET_PDEATHSIG``, one copy) and ending a process without the
interpreter's finalization (a rank, fresh or forked by the warm server)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    try:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)  # loaded now: the helper below runs between fork and exec
    except OSError:  # pragma: no cover - a libc that cannot be loaded
        _libc = None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one another user owns counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
    so no rank outlives its supervisor. Safe between fork and exec (no allocation, no import).
    False where it is unavailable (not Linux, no libc)."""
    if _libc is None:
        return False
    try:
        return _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_process(code: int, by_signal: int | None = None) -> None:
    """End this process as the interpreter's exit would, minus its finalization: join the
    non-daemon threads, run the atexit handlers, flush stdout and stderr, then ``os._exit``
    (with ``by_signal``: end by that signal's default action instead, as the interpreter does
    after a ``KeyboardInterrupt``). Tearing down torch's ~2,000 modules takes 0.3-0.5 s that a
    rank's supervisor (and so the driver) would wait for, after the result is out."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's exit: join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if by_signal is not None:
        signal.signal(by_signal, signal.SIG_DFL)
        os.kill(os.getpid(), by_signal)
        code = 128 + by_signal  # (the signal was blocked)
    os._exit(code)


def cmdline_arg(argv: list[bytes], name: bytes) -> str | None:
    """The value after ``name`` in a command line read from ``/proc/<pid>/cmdline`` (split at
    NUL bytes), or None when it is not there."""
    try:
        return argv[argv.index(name) + 1].decode()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


__all__ = ["pid_alive", "die_with_parent", "exit_process", "cmdline_arg"]
