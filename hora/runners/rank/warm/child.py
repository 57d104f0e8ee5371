"""The child of a warm server (:mod:`hora.runners.rank.warm.server`), between its fork and the rank's code:
its own session, the supervisor's pipes as fds 0-2, the request's environment and cwd, fresh random
state; then the rank's module (``python -m MODULE ARGS``), or a ``hora run`` command's script or module as
a fresh ``python`` would run it (:func:`_run_command`), and its exit status as the interpreter makes it.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import os
import random
import runpy
import signal
import socket
import sys
import traceback
import types
from typing import Any

from hora.pids import die_with_parent, exit_process

#: the rank entry every launcher runs (``python -m``); the server preloads it by name, and a child
#: runs it through its ``main(argv)`` rather than runpy (a second copy would run, with a warning)
RANK_ENTRY = "hora.runners.rank.main"
#: the server's cwd at its start, sys.path[0] of ``python -m`` there
_START_CWD = os.getcwd()


def _child_main(request: dict[str, Any], fds: list[int], close_fds: list[int], socks: list[socket.socket],
                server_pid: int) -> None:
    code = 1
    try:
        os.setsid()  # its own session and process group, as start_new_session
        die_with_parent()
        if os.getppid() != server_pid:
            os._exit(143)  # the server died before PR_SET_PDEATHSIG took effect
        for fd in close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for s in socks:
            s.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        logging.getLogger("hora.runners.rank.warm.server").handlers.clear()
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == _START_CWD:  # what `python -m` in the child's cwd would have there
            sys.path[0] = os.getcwd()
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if request.get("command"):
            _run_command(request)  # never returns
        sys.argv = [request["module"], *request["args"]]
        if request["module"] == RANK_ENTRY:
            # preloaded above: runpy would execute a second copy of it (and warn that it is
            # already in sys.modules); run the imported module's entry point instead
            code = _exit_code(sys.modules[RANK_ENTRY].main(request["args"]))
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        exit_process(code)


def _command_stdio(env: dict[str, str]) -> None:
    """Fresh ``sys.stdin``/``stdout``/``stderr`` on fds 0-2, buffered as a new interpreter
    with ``env`` would make them (``PYTHONUNBUFFERED``: write-through; a terminal: line
    buffered; stderr: line buffered, ``backslashreplace``), not as the server's were."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = env.get("PYTHONIOENCODING", "").split(":")[0] or None

    def stream(fd: int, mode: str, errors: str | None) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffer: Any = raw if unbuffered and mode == "wb" else (
            io.BufferedReader(raw) if mode == "rb" else io.BufferedWriter(raw))
        return io.TextIOWrapper(buffer, encoding=encoding, errors=errors,
                                line_buffering=mode == "wb" and (tty or fd == 2), write_through=unbuffered)

    sys.stdin = sys.__stdin__ = stream(0, "rb", None)
    sys.stdout = sys.__stdout__ = stream(1, "wb", None)
    sys.stderr = sys.__stderr__ = stream(2, "wb", "backslashreplace")


def _run_command(request: dict[str, Any]) -> None:
    """Run a ``hora run`` command rank (``python SCRIPT ARGS`` or ``python -m MODULE ARGS``) as
    that fresh interpreter would, and end the process: ``__main__`` is the script (its
    ``__file__`` absolute, ``sys.argv[0]`` as given, ``sys.path[0]`` its folder) or the module
    run by :func:`runpy.run_module`; an uncaught exception goes through ``sys.excepthook``
    with the server's frames left out (exit code 1), a ``KeyboardInterrupt`` ends the process
    by SIGINT, ``SystemExit`` gives its code; atexit handlers run and stdio is flushed
    (:func:`hora.pids.exit_process`)."""
    _command_stdio(request["env"])
    script = request.get("script")
    try:
        if script is not None:
            sys.argv = [request["argv0"], *request["args"]]
            if sys.path:
                sys.path[0] = os.path.dirname(os.path.realpath(script))
            main = types.ModuleType("__main__")
            main.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins, __loader__=None)
            sys.modules["__main__"] = main
            with io.open_code(script) as fh:
                code = compile(fh.read(), script, "exec")
            exec(code, main.__dict__)
        else:
            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:
        tb = exc.__traceback__  # from the first frame of the user's code, as the interpreter shows it
        while tb is not None and tb.tb_next is not None and _server_frame(tb.tb_frame.f_code.co_filename, script):
            tb = tb.tb_next
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # (3.12's hook prints exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):  # as the interpreter: it ends by the signal
            exit_process(1, by_signal=signal.SIGINT)
        code = 1
    exit_process(code)


def _server_frame(filename: str, script: str | None) -> bool:
    """Whether a traceback frame in ``filename`` is the server's own (or runpy's) before the
    user's ``script`` (None: a module) runs."""
    if script is not None:
        return filename != script
    return filename == __file__ or filename == runpy.__file__ or filename.endswith("runpy>")


def _exit_code(value: Any) -> int:
    """The exit status of ``SystemExit(value)``, as the interpreter makes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"{value}\n")
    return 1
