"""Warm rank processes: a fork server per owner process and environment.

Every rank used to be a fresh ``python -m hora.runners.rank.main`` that imported torch
(1-1.5 s) and, at its first optimizer call, ``torch._dynamo`` (~1 s) anew. A *warm
server* (``python -m hora.runners.rank.warm.server``, :mod:`hora.runners.rank.warm.server`) imports them once
(``HORA_WARM_PRELOAD``) and forks one child per rank request, as ``multiprocessing``'s
forkserver with ``set_forkserver_preload`` does. The second ``fit`` on the same Dask
workers or Spark python workers starts its ranks with everything imported.

The client side, :func:`spawn`, is what :class:`~hora.runners.rank.procs.ProcessLauncher`
calls instead of :class:`subprocess.Popen`; it returns a :class:`WarmProcess` (``pid``,
``poll``, ``wait``, ``send_signal``, ``kill``, ``stdin``/``stdout``/``stderr`` pipes) or
None, and the launcher then starts a plain subprocess (with a logged warning): a server
that cannot start or answer never fails a fit. The child is what ``python -m MODULE ARGS``
would be: its own session (process group), the supervisor's pipes as fds 0-2 (passed
over the Unix socket with SCM_RIGHTS), the requested environment and cwd, Python's random
state re-seeded; its exit code (``-N`` for signal N) is sent back when the server reaps it.
Killing it by pid or process group works as for a subprocess.

Reuse key: the interpreter, the cwd, and the environment minus the ``HORA_*`` variables
(none of which hora reads at import, except :data:`KEYED_HORA`) and :data:`UNKEYED`, so per-rank and per-run
variables do not start a new server; the server's own check of its code (the hora sources'
and ``sys.path`` folders' mtimes) answers ``stale`` after an install or an edit, and the
client starts a fresh one. One server per key and owner: the process that asked for it, or,
in a Spark task, the executor (:func:`hora.runners.rank.warm.owner.owner`), so every Python worker of the executor
uses it; at most :data:`MAX_SERVERS` started by one process (the oldest is asked to quit).
A Spark executor's server is keyed by its application and host instead of the executor
(:class:`Owner`): it outlives a lost executor and serves the one started in its place.
Starting is serialized across processes by a lock file beside the socket, so a server that
:func:`prestart` is starting (a fit does that while it materializes its data) is waited
for, not started twice.

Lifetime: the server exits when its owner is gone (a pidfd; a Spark executor's server passes
to the application's next executor on the host when one starts within
:data:`~hora.runners.rank.warm.server.ORPHAN_WAIT` seconds, and ends with the executors'
keeper), after ``HORA_WARM_IDLE_TIMEOUT`` seconds without children, or when asked; a child dies with the server (PR_SET_PDEATHSIG)
and with its supervisor (the server kills its process group when the supervisor's
connection closes). ``HORA_WARM_WORKERS=0`` turns all of it off.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import IO, Any

from hora import settings
from hora.runners.rank.warm.owner import DASK_APP, Owner, command_owner, owner

log = logging.getLogger(__name__)

ENV_WARM = "HORA_WARM_WORKERS"
ENV_IDLE = "HORA_WARM_IDLE_TIMEOUT"
ENV_PRELOAD = "HORA_WARM_PRELOAD"
ENV_COMMANDS = "HORA_WARM_COMMANDS"
#: the HORA_* variables a server's key keeps: read at import (``import hora``) or by the server itself
KEYED_HORA = (settings.ENV_LOG_LEVEL, ENV_PRELOAD, ENV_IDLE)
#: variables outside ``HORA_*`` that a server's key leaves out: they change from one call to the
#: next in the same process and no import reads them (pytest sets ``PYTEST_CURRENT_TEST`` for
#: every test phase: keyed, a test suite's local runs would start a server per test). A rank
#: still gets them: its whole environment is the request's.
#: A Spark executor's Python workers also carry variables that differ between the executors of
#: one application on one host (their log URLs and block-manager folders) or between their
#: daemons (the worker factory's secret): keyed, the executor that replaces a lost one would
#: not find the server its predecessor left (see :class:`Owner`).
#: torch writes its inductor cache folder (its default, read at compile time) into the environment
#: of a process that compiles: a Dask driver's nanny then starts the worker that replaces a lost one
#: with it, and, keyed, that worker would not find the server the lost one left.
UNKEYED = ("PYTEST_CURRENT_TEST", "PYTHON_WORKER_FACTORY_SECRET", "SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT",
           "SPARK_LOCAL_DIRS", "TORCHINDUCTOR_CACHE_DIR")
MAX_SERVERS = 2  # per owner process: each holds torch's ~300 MiB
READY_TIMEOUT = 120.0  # seconds a new server may take to import its modules
ANSWER_TIMEOUT = 10.0  # seconds a running server may take to answer a request
RETRY_AFTER = 600.0  # seconds before a server that failed to start is tried again
_LEN = struct.Struct("!I")
TITLE_ROOM = 1024  # bytes of the server's command line a child's own replaces (what ps shows)


class WarmUnavailable(Exception):
    """The warm server could not start or answer (the caller starts a plain subprocess)."""


# ------------------------------------------------------------------------------------------
# the key and where a server listens
# ------------------------------------------------------------------------------------------
def server_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a server for ``env`` runs with: ``env`` without the ``HORA_*``
    variables outside :data:`KEYED_HORA` (hora reads the others at ``init`` or later) and
    without :data:`UNKEYED`."""
    return {k: v for k, v in env.items()
            if (not k.startswith("HORA_") or k in KEYED_HORA) and k not in UNKEYED}


def server_key(python: str, cwd: str, env: Mapping[str, str]) -> str:
    """The reuse key of a server: the interpreter, the cwd and :func:`server_environ`."""
    blob = json.dumps([os.path.realpath(python), cwd, sorted(server_environ(env).items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _runtime_dir() -> str:
    base = tempfile.gettempdir()
    if len(base) > 60:  # a Unix socket path has ~107 bytes
        base = "/tmp"
    path = os.path.join(base, f"hora-warm-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WarmUnavailable(f"{path} is not a private folder of this user")
    return path


def socket_path(key: str, owner: int | str) -> str:
    """Where the server of ``key`` owned by process ``owner`` (or by the Spark application and
    host ``owner`` names, :attr:`Owner.app`) listens."""
    if isinstance(owner, str):
        owner = "app" + hashlib.sha256(owner.encode()).hexdigest()[:12]  # a host name may be long: ~107 bytes
    return os.path.join(_runtime_dir(), f"{key}-{owner}.sock")


def _server_path(python: str, cwd: str, skey: Mapping[str, str], who: Owner | None = None) -> tuple[str, Owner]:
    """Where the server for this request listens, and its owner (default :func:`owner`). A
    Spark executor's server is keyed by its application and host instead of the executor's own
    folder (the cwd), so the executor that replaces a lost one finds it (the child still runs
    in its own cwd)."""
    who = who or owner()
    path = socket_path(server_key(python, who.app or cwd, skey), who.app or who.pid)
    if who.app is not None and who.app.startswith(DASK_APP):
        _quit_at_exit(path)
    return path, who


_at_exit: set[str] = set()  # the Dask worker servers this process asks to quit when it exits
_at_exit_lock = threading.Lock()  # not _lock: a prestart holds that while its server imports
QUIT_AT_EXIT_TIMEOUT = 2.0  # seconds each of them may take to answer then


def _quit_at_exit(path: str) -> None:
    """Ask the server at ``path`` to quit when this process exits normally: a Dask worker's
    server outlives a worker that was killed (its nanny starts another one, which takes the
    server over), not one that was closed (the cluster closing, a restart)."""
    with _at_exit_lock:
        if not _at_exit:
            atexit.register(_quit_servers_at_exit)
        _at_exit.add(path)


def _quit_servers_at_exit() -> None:
    for path in sorted(_at_exit):
        _ask_quit(path, QUIT_AT_EXIT_TIMEOUT)


@contextlib.contextmanager
def _starting(path: str, timeout: float) -> Any:
    """Hold the start lock of ``path``'s server (a lock file, so across processes: the Python
    workers of one Spark executor share their servers); False when not had in ``timeout`` s."""
    fd = os.open(path[: -len(".sock")] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise WarmUnavailable(f"another process has been starting the warm server {path} for over "
                                          f"{timeout:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------------------------------
# the client: spawn() and the Popen-like handle
# ------------------------------------------------------------------------------------------
class WarmProcess:
    """A rank forked by the warm server, handled like a :class:`subprocess.Popen`.

    ``returncode`` is the child's exit code, ``-N`` when signal N ended it, as the server
    reports it; a server that dies first reports nothing, and the child (which dies with
    it) counts as killed (``-9``).
    """

    def __init__(self, args: Sequence[str], pid: int, conn: socket.socket, stdin: IO[bytes] | None,
                 stdout: IO[bytes], stderr: IO[bytes], received: bytes = b"") -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._conn = conn
        self._buf = received  # what the server sent after the pid: its exit line, when the child ended at once
        self._lock = threading.Lock()

    def _read(self, timeout: float) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            if b"\n" not in self._buf:  # (the exit line may have come with the pid: _answer_and_rest)
                try:
                    ready, _, _ = select.select([self._conn], [], [], max(0.0, timeout))
                    if not ready:
                        return
                    chunk = self._conn.recv(4096)
                except OSError:  # reset: as a closed connection
                    chunk = b""
                if not chunk:
                    log.warning("the warm server of pid %d went away; counting it as killed", self.pid)
                    self.returncode = -signal.SIGKILL
                self._buf += chunk
            if self.returncode is None and b"\n" in self._buf:
                self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["exit"])
            if self.returncode is not None:
                self._conn.close()

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process (nothing once it has been reaped)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_lock = threading.Lock()
_servers: OrderedDict[str, subprocess.Popen] = OrderedDict()  # socket path -> the server this process started
_retired: list[subprocess.Popen] = []  # servers asked to end or found ended: reaped once they have exited
_failed: dict[str, float] = {}  # socket path -> when its server failed to start (not retried for a while)


def _reap() -> None:
    """Collect the exit of every server of this process that has ended (no zombies)."""
    for path, proc in list(_servers.items()):
        if proc.poll() is not None:
            del _servers[path]
    _retired[:] = [p for p in _retired if p.poll() is None]


def _retire(path: str) -> None:
    proc = _servers.pop(path, None)
    if proc is not None:
        _retired.append(proc)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ranks start from a warm server (``HORA_WARM_WORKERS``, default on; Linux only)."""
    return sys.platform.startswith("linux") and bool(settings.get(ENV_WARM, environ)) and hasattr(os, "pidfd_open")


def forkable_command(argv: Sequence[str], cwd: str | None = None, path: str | None = None) -> bool:
    """Whether a ``hora run`` command can fork from a warm server of this interpreter: it is
    ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` where ``python`` (a path, or a name
    looked up on ``path``, default ``PATH``) is :data:`sys.executable` itself or another name
    for it in the same folder (``python3`` in a virtualenv's ``bin``), and ``SCRIPT`` is a file.
    Not: another interpreter, ``python -c``, interpreter options, a shell command."""
    if len(argv) < 2 or argv[1] in ("-", ""):
        return False
    found = shutil.which(argv[0], path=path)
    if found is None:
        return False
    found, ours = os.path.abspath(found), os.path.abspath(sys.executable)
    if found != ours and (os.path.dirname(found) != os.path.dirname(ours)
                          or os.path.realpath(found) != os.path.realpath(ours)):
        return False
    if argv[1] == "-m":
        return len(argv) >= 3 and bool(argv[2]) and not argv[2].startswith("-")
    if argv[1].startswith("-"):
        return False
    return os.path.isfile(os.path.join(cwd or os.getcwd(), argv[1]))


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
          import_env: Mapping[str, str] | None = None, stdin: bool = True,
          command: bool = False, exit_report: Mapping[str, str] | None = None) -> WarmProcess | None:
    """Start ``argv`` (``python -m MODULE ARGS...``; with ``command``, also ``python SCRIPT
    ARGS``: a ``hora run`` command rank, see :func:`forkable_command`) as a child of a warm
    server, or None (logged as a warning) when no server can start or answer: the caller then
    starts a plain subprocess.

    ``env`` is the child's whole environment; ``import_env``: variables the rank sets before
    its imports (the run's own), which therefore belong to the server's key too.
    ``exit_report``: ``{"addr", "secret" (hex), "key"}``: when the server ends the child itself
    (its supervisor, this process, or its owner gone), it sets ``key`` to ``b"1"`` in the driver
    service at ``addr`` (the word this process can no longer send).
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    target: dict[str, Any]
    if len(argv) >= 3 and argv[1] == "-m":
        python, target, args = argv[0], {"module": argv[2]}, list(argv[3:])
    elif command and len(argv) >= 2 and not argv[1].startswith("-"):
        python, args = argv[0], list(argv[2:])
        target = {"script": os.path.abspath(os.path.join(cwd, argv[1])), "argv0": argv[1]}
    else:
        raise ValueError(f"a warm rank runs 'python -m MODULE ...', not {list(argv)!r}")
    if command:
        target["command"] = True
        python = sys.executable  # the command's python is this one (forkable_command)
    skey = {**env, **(import_env or {})}
    try:
        path, who = _server_path(python, cwd, skey, command_owner() if command else None)
        with _lock:
            _reap()
            try:
                return _request(path, target, args, env, cwd, stdin, who.pid, exit_report)
            except (_Stale, _Gone, FileNotFoundError, ConnectionRefusedError):
                _retire(path)  # stale, ending (its idle time ran out), never started, or starting
            failed_at = _failed.get(path)
            if failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER:
                return None  # warned when it failed
            with _starting(path, READY_TIMEOUT):
                try:  # another process (a prestart) may have started it while this one waited
                    return _request(path, target, args, env, cwd, stdin, who.pid, exit_report)
                except (_Stale, _Gone, FileNotFoundError, ConnectionRefusedError):
                    _retire(path)
                _start_checked(python, path, cwd, server_environ(skey), who)
            return _request(path, target, args, env, cwd, stdin, who.pid, exit_report)
    except (OSError, WarmUnavailable, _Stale, ValueError, KeyError) as exc:
        log.warning("no warm rank process (%s); starting a plain one", exc)
        return None


def _start_checked(python: str, path: str, cwd: str, env: dict[str, str], who: Owner) -> None:
    """:func:`_start_server`, remembering a failure (not retried for :data:`RETRY_AFTER` s)."""
    try:
        _start_server(python, path, cwd, env, who)
    except BaseException:
        _failed[path] = time.monotonic()
        raise


def _serving(path: str) -> bool:
    """Whether a server listens at ``path`` and its code is current (a stale one then ends)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(ANSWER_TIMEOUT)
            conn.connect(path)
            _send(conn, {"op": "ping"})
            return bool(_answer(conn, ANSWER_TIMEOUT).get("ok"))
    except (OSError, WarmUnavailable, ValueError):
        return False


def prestart(python: str, env: Mapping[str, str], cwd: str | None = None,
             import_env: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Start, in a background thread, the server that :func:`spawn` with the same ``python``,
    ``env``, ``cwd`` and ``import_env`` will use, and return at once (None: warm ranks are off,
    or it listens already).

    A fit calls it on the hosts of its ranks while it materializes the data, so its first
    ranks fork from a server that has imported torch instead of waiting for that import
    (2-3 s). :func:`spawn` meanwhile waits for the start (the start lock) instead of
    starting a second server. Failures are logged, never raised: the ranks then start as
    they would have.
    """
    if not enabled({**env, **(import_env or {})}):
        return None
    cwd = os.path.abspath(cwd or os.getcwd())
    skey = {**env, **(import_env or {})}
    try:
        path, who = _server_path(python, cwd, skey)
    except (OSError, WarmUnavailable) as exc:
        log.debug("no warm server prestart: %s", exc)
        return None
    if _serving(path):
        return None

    def start() -> None:
        try:
            with _lock:
                _reap()
                with _starting(path, READY_TIMEOUT):
                    if not _serving(path):
                        _retire(path)
                        _start_checked(python, path, cwd, server_environ(skey), who)
        except (OSError, WarmUnavailable, ValueError, KeyError) as exc:
            log.warning("could not start a warm rank server ahead of the ranks: %s", exc)

    thread = threading.Thread(target=start, name="hora-warm-prestart", daemon=True)
    thread.start()
    return thread


class _Stale(Exception):
    """The server's code changed since it started: it stopped listening."""


class _Gone(WarmUnavailable):
    """The server closed the connection without an answer (it was ending)."""


def _send(conn: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = _LEN.pack(len(data)) + data
    sent = socket.send_fds(conn, [frame], list(fds)) if fds else conn.send(frame)
    if sent < len(frame):  # not an empty sendall: the server may have answered and closed already (EPIPE)
        conn.sendall(frame[sent:])


def _answer(conn: socket.socket, timeout: float) -> dict[str, Any]:
    reply, rest = _answer_and_rest(conn, timeout)
    if rest:
        raise WarmUnavailable("the warm server answered out of turn")
    return reply


def _answer_and_rest(conn: socket.socket, timeout: float) -> tuple[dict[str, Any], bytes]:
    """The server's next answer, and whatever it sent after it: a spawned child that exits at once
    has its ``{"exit": ...}`` line sent right behind the ``{"pid": ...}`` one, and a loaded client
    reads both in one ``recv`` (the rest is the :class:`WarmProcess`'s)."""
    conn.settimeout(timeout)
    buf = b""
    try:
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                raise _Gone("the warm server closed the connection without an answer")
            buf += chunk
    except socket.timeout:
        raise WarmUnavailable(f"the warm server did not answer within {timeout:g}s") from None
    finally:
        conn.settimeout(None)
    line, rest = buf.split(b"\n", 1)
    return json.loads(line), rest


def _request(path: str, target: Mapping[str, Any], args: list[str], env: Mapping[str, str], cwd: str,
             want_stdin: bool, owner: int | None = None, exit_report: Mapping[str, str] | None = None) -> WarmProcess:
    """Ask the server at ``path`` to fork ``target``: ``{"module": NAME}`` or ``{"script": PATH,
    "argv0": ARG}``, with ``"command": True`` for a command rank."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ANSWER_TIMEOUT)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        raise
    pipes = [os.pipe() if want_stdin else None, os.pipe(), os.pipe()]
    theirs = [pipes[0][0] if pipes[0] else os.open(os.devnull, os.O_RDONLY), pipes[1][1], pipes[2][1]]
    ours = [pipes[0][1] if pipes[0] else None, pipes[1][0], pipes[2][0]]
    try:
        try:
            request = {"op": "spawn", **target, "args": args, "env": dict(env), "cwd": cwd}
            if owner is not None:  # the child dies with this owner (a server may serve several)
                request["owner"] = owner
            if exit_report is not None:
                request["exit_report"] = dict(exit_report)
            _send(conn, request, theirs)
            reply, rest = _answer_and_rest(conn, ANSWER_TIMEOUT)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Gone(f"the warm server closed the connection: {exc}") from None
    except BaseException:
        conn.close()
        for fd in ours:
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        for fd in ours:
            if fd is not None:
                os.close(fd)
        if reply.get("error") == "stale":
            raise _Stale("the warm server's code changed")
        raise WarmUnavailable(f"the warm server refused: {reply.get('error')}")
    stdin = os.fdopen(ours[0], "wb") if ours[0] is not None else None
    shown = ["-m", target["module"]] if "module" in target else [target["argv0"]]
    return WarmProcess([sys.executable, *shown, *args], int(reply["pid"]), conn, stdin,
                       os.fdopen(ours[1], "rb"), os.fdopen(ours[2], "rb"), rest)


def _start_server(python: str, path: str, cwd: str, env: dict[str, str], who: Owner | None = None) -> None:
    """Start a server for ``path``, owned by ``who`` (default: :func:`owner`), and wait until it listens.

    Raises:
        WarmUnavailable: it exited, or did not listen within :data:`READY_TIMEOUT` seconds.
    """
    while len(_servers) >= MAX_SERVERS:
        old = next(iter(_servers))
        _ask_quit(old)
        _retire(old)
    idle = settings.get(ENV_IDLE, env)
    who = who or owner()
    adopt = [f"--app={who.app}", f"--keeper={who.keeper or 0}"] if who.app else []
    logfile = path[: -len(".sock")] + ".log"
    read_fd, write_fd = os.pipe()
    try:
        with open(logfile, "wb") as err:
            proc = subprocess.Popen(
                [python, "-m", "hora.runners.rank.warm.server", path, str(who.pid), str(idle), str(write_fd),
                 *adopt, "." * TITLE_ROOM],
                env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                pass_fds=(write_fd,), close_fds=True, start_new_session=True,
            )
        os.close(write_fd)
        write_fd = -1
        ready, _, _ = select.select([read_fd], [], [], READY_TIMEOUT)
        line = os.read(read_fd, 256).decode() if ready else ""
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    if not line.startswith("ready "):
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            if os.path.getsize(logfile) == 0:
                os.unlink(logfile)
                logfile = "empty"
        raise WarmUnavailable(f"the warm server did not start ({line.strip() or 'no answer'}; its log: {logfile})")
    _servers[path] = proc
    log.debug("warm server %s started: pid %d", path, proc.pid)


def _ask_quit(path: str, timeout: float = ANSWER_TIMEOUT) -> None:
    with contextlib.suppress(OSError, WarmUnavailable), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        _send(conn, {"op": "quit"})
        _answer(conn, timeout)


def stop_servers() -> None:
    """Ask every warm server this process started to quit (each finishes its children first)."""
    with _lock:
        for path in list(_servers):
            _ask_quit(path)
            _retire(path)
        for proc in _retired:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(ANSWER_TIMEOUT)
        _reap()


__all__ = ["Owner", "command_owner", "owner", "WarmProcess", "WarmUnavailable", "spawn", "forkable_command", "enabled", "server_key", "server_environ", "socket_path",
           "stop_servers", "ENV_WARM", "ENV_IDLE", "ENV_PRELOAD", "ENV_COMMANDS"]
