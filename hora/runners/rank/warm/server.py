"""The warm server: ``python -m hora.runners.rank.warm.server SOCKET OWNER_PID IDLE READY_FD [--app=APP@HOST --keeper=PID] [ROOM]``.

Started by :func:`hora.runners.rank.warm.client.spawn` (see :mod:`hora.runners.rank.warm.client` for the design).
It stays a child of its starter (so a rank's ancestors are its supervisor's, as a plain
subprocess's are: tests and tools walk up from a rank to its Spark executor; not for the
ranks of a replacement executor that a Spark executor's server adopted, whose starter is
gone: walk up from ``HORA_SUPERVISOR_PID`` instead), imports
``HORA_WARM_PRELOAD`` (torch, torch._dynamo, hora's op layer: no torch op runs, so no
thread pool exists), binds ``SOCKET`` and writes ``ready <pid>`` to ``READY_FD``. Then one
thread (a fork is only safe with no other Python thread: checked before each) polls the
listening socket, the owner's pidfd, and each child's pidfd and supervisor connection:

* a ``spawn`` request (from this user only: SO_PEERCRED) forks a child that runs
  ``python -m MODULE ARGS`` on the passed fds, environment and cwd; the answer is its pid,
  and ``{"exit": code}`` follows when the child is reaped;
* a supervisor whose connection closes takes its child with it (SIGKILL to the group);
  a child the server ended itself (its supervisor or its owner gone), once reaped, is reported
  exited to the driver service its request named (``exit_report``: the word a Spark task's
  killed Python worker can no longer send, so the driver need not wait for the rank's silence);
* an owner's end takes the children it asked for with it (a request names its owner; a
  server may serve several: the executors of one Spark application on one host);
* the last owner's end, a ``quit`` request, or ``IDLE`` seconds without a child end the server;
  except, with ``--app`` (a Spark executor's or a Dask worker's server,
  :class:`hora.runners.rank.warm.owner.Owner`), after its last owner's end the server waits up to
  :data:`ORPHAN_WAIT` seconds for the process that replaces it and passes to it: for Spark an
  executor JVM of the same application and host (the one the cluster manager starts in place of a
  lost one), which it looks for; for Dask the worker its nanny restarts, which takes it over with its
  first rank request; it ends at once when ``--keeper`` (the executor's parent, the standalone
  Worker; the process of the Dask worker's nanny) ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from hora.pids import cmdline_arg
from hora.runners.rank.warm.child import RANK_ENTRY, _child_main
from hora.runners.rank.warm.owner import DASK_APP

log = logging.getLogger("hora.runners.rank.warm.server")

_LEN = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")
REQUEST_TIMEOUT = 10.0
MAX_REQUEST = 16 << 20
#: seconds a Spark executor's server waits for the executor that replaces its lost one (the
#: standalone Worker forks it within a second of the loss; a JVM start on a loaded host is slow,
#: but its process exists early); without one it ends (the application ended)
ORPHAN_WAIT = 60.0
ORPHAN_POLL = 0.25  # seconds between two looks for that executor
#: the directory this server started in (``sys.path[0]`` of ``python -m``): a child that runs in
#: another cwd (a replacement executor's) gets its own there instead


@dataclass
class _Child:
    pid: int
    pidfd: int
    conn: socket.socket | None
    owner: int = 0  # the pid of the owner it dies with
    report: dict[str, str] | None = None  # the request's exit_report
    killed: bool = False  # the server ended it (its supervisor or owner gone)


#: seconds the server's one thread gives a report of a killed child's exit (a driver on this
#: host answers in milliseconds; one that is gone, whose refused connects are retried until
#: this deadline, costs the server's other clients this wait at most)
REPORT_TIMEOUT = 0.3


def _report_exit(child: _Child) -> None:
    """Tell the child's driver service that its rank exited (``exit_report``), if the server
    ended the child; best effort, within :data:`REPORT_TIMEOUT`."""
    if child.report is None or not child.killed:
        return
    from hora.native.rendezvous import tls
    from hora.native.rendezvous import KVClient

    try:
        secret = bytes.fromhex(child.report["secret"])
        if child.report.get("tls"):  # the run's TLS certificate, to pin
            tls.register(secret, tls.JobCertificate.from_text(child.report["tls"]))
        client = KVClient(child.report["addr"], secret, timeout=REPORT_TIMEOUT)
        try:
            client.set(child.report["key"], b"1")
        finally:
            client.close()
        log.info("warm server: reported the exit of pid %d (%s)", child.pid, child.report["key"])
    except Exception as exc:  # the driver may be gone too
        log.info("warm server: could not report the exit of pid %d: %s", child.pid, exc)


def _app_executor(app: str, exclude: set[int]) -> int | None:
    """The pid of a live executor JVM of this user whose command line names the application and
    host of ``app`` (``"<app id>@<host>"``), other than ``exclude``; None when there is none, and
    always for a Dask worker's ``app`` (:data:`DASK_APP`): the worker its nanny starts in place of
    a lost one is not told apart by its command line, and takes the server over when it asks for a rank."""
    if app.startswith(DASK_APP):  # a Dask worker's replacement takes the server over with its first request
        return None
    app_id, _, host = app.rpartition("@")
    uid = os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"java" and \
                (cmdline_arg(argv, b"--app-id"), cmdline_arg(argv, b"--hostname")) == (app_id, host):
            return int(name)
    return None


def _code_stamp() -> str:
    """A digest of the hora sources' and the ``sys.path`` folders' mtimes (an install or an
    edit changes it: the server is then stale)."""
    # the hora package's folder: this file is hora/runners/rank/warm/server.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".so")):
                st = os.stat(os.path.join(folder, name))
                h.update(f"{folder}/{name}:{st.st_mtime_ns}:{st.st_size};".encode())
    for entry in sys.path:
        with contextlib.suppress(OSError):
            h.update(f"{entry}:{os.stat(entry or '.').st_mtime_ns};".encode())
    return h.hexdigest()


def _preload(names: str) -> list[str]:
    """Import each comma-separated module; return the ones that failed (logged)."""
    failed = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            module = importlib.import_module(name)
            if name == "hora.native":
                module.init  # noqa: B018 - hora.native is lazy: this loads the op layer
        except Exception as exc:
            log.warning("warm server: cannot preload %s: %s", name, exc)
            failed.append(name)
    importlib.import_module(RANK_ENTRY)
    return failed


class Server:
    """The listening socket, the owner and the children (see the module docstring)."""

    def __init__(self, path: str, owner_fd: int, idle: float, title: list[str], owner: int = 0,
                 app: str | None = None, keeper_fd: int | None = None) -> None:
        self.path = path
        self.title = title
        self.idle = idle
        self.owner_fd = owner_fd  # the first owner's pidfd
        self.owners: dict[int, int] = {owner_fd: owner}  # pidfd -> pid of every live owner
        self.app = app
        self.keeper_fd = keeper_fd
        self.orphaned: float | None = None  # when the last owner ended (an app's server waits for the next)
        self.lost_owners: set[int] = set()
        self.stamp = _code_stamp()
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(tmp)
        self.listener.listen(64)
        os.rename(tmp, path)  # clients see a socket only once it listens
        self.inode = os.stat(path).st_ino
        self.children: dict[int, _Child] = {}
        self.by_conn: dict[int, _Child] = {}
        self.poller = select.poll()
        self.poller.register(self.owner_fd, select.POLLIN)
        if keeper_fd is not None:
            self.poller.register(keeper_fd, select.POLLIN)
        self.poller.register(self.listener.fileno(), select.POLLIN)
        self.last_active = time.monotonic()
        self.fresh: set[int] = set()  # fds registered while the current batch of events is handled

    # -- the loop -------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            if not self.children and (self.listener is None or time.monotonic() - self.last_active > self.idle):
                return
            if self.orphaned is not None and not self._find_owner():
                return
            self.fresh = set()
            for fd, _events in self.poller.poll(1000 if self.orphaned is None else ORPHAN_POLL * 1000):
                if fd in self.fresh:  # registered during this batch: an event polled before is another fd's
                    continue
                if fd == self.keeper_fd:
                    log.info("warm server: its executors' keeper is gone; exiting")
                    self._kill_all()
                    return
                if fd in self.owners:
                    if not self._owner_gone(fd):
                        return
                    continue
                if self.listener is not None and fd == self.listener.fileno():
                    self._accept()
                elif fd in self.by_conn:
                    self._supervisor_gone(self.by_conn[fd])
                else:
                    child = next((c for c in self.children.values() if c.pidfd == fd), None)
                    if child is not None:
                        self._reap(child)

    def close(self) -> None:
        """Stop listening (the socket path goes at once, so a new server may take it)."""
        if self.listener is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:  # not a successor's socket
                os.unlink(self.path)
        self.poller.unregister(self.listener.fileno())
        self.listener.close()
        self.listener = None

    def _owner_gone(self, fd: int) -> bool:
        """An owner ended: kill the children it asked for; False when the server ends now (its
        last owner, and no application whose next executor it could pass to)."""
        pid = self.owners.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        self.lost_owners.add(pid)
        for child in self.children.values():
            if child.owner == pid:
                child.killed = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
        if self.owners:
            log.info("warm server: its owner %d is gone; killed its ranks", pid)
            return True
        if self.app is None:
            log.info("warm server: its owner is gone; exiting")
            self._kill_all()
            return False
        log.info("warm server: its owner %d (%s) is gone; killed its ranks, waiting up to %gs for the process "
                 "that replaces it", pid, self.app, ORPHAN_WAIT)
        self.orphaned = time.monotonic()
        return True

    def _adopt(self, pid: int) -> bool:
        """Follow ``pid`` as an owner too; False when it is not running."""
        if pid in self.owners.values():
            return True
        try:
            fd = os.pidfd_open(pid)
        except (OSError, ValueError, OverflowError):
            return False
        self.owners[fd] = pid
        self.poller.register(fd, select.POLLIN)
        self.fresh.add(fd)
        if self.orphaned is not None:
            log.info("warm server: %d took over after %.1fs", pid, time.monotonic() - self.orphaned)
        self.orphaned = None
        return True

    def _find_owner(self) -> bool:
        """An ownerless application server: adopt the application's executor on this host if one
        runs; False when none came within :data:`ORPHAN_WAIT` seconds (its ranks are killed)."""
        assert self.app is not None and self.orphaned is not None
        pid = _app_executor(self.app, self.lost_owners)
        if pid is not None and self._adopt(pid):
            return True
        if time.monotonic() - self.orphaned < ORPHAN_WAIT:
            return True
        log.info("warm server: no process took %s over within %gs; exiting", self.app, ORPHAN_WAIT)
        self._kill_all()
        return False

    def _kill_all(self) -> None:
        for child in list(self.children.values()):
            child.killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
            _report_exit(child)

    def _supervisor_gone(self, child: _Child) -> None:
        assert child.conn is not None
        self.poller.unregister(child.conn.fileno())
        del self.by_conn[child.conn.fileno()]
        child.conn.close()
        child.conn = None
        log.info("warm server: the supervisor of pid %d is gone; killing its group", child.pid)
        child.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)

    def _reap(self, child: _Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.poller.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        self.last_active = time.monotonic()
        _report_exit(child)
        if child.conn is not None:
            self.poller.unregister(child.conn.fileno())
            del self.by_conn[child.conn.fileno()]
            with contextlib.suppress(OSError):
                child.conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
            child.conn.close()

    # -- requests -------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self.listener is not None
        conn, _ = self.listener.accept()
        fds: list[int] = []
        keep = False
        try:
            _pid, uid, _gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid != os.getuid():
                log.warning("warm server: refused a connection of uid %d", uid)
                return
            conn.settimeout(REQUEST_TIMEOUT)
            request, fds = _read_request(conn)
            op = request.get("op")
            if op == "quit":
                self.close()
                _reply(conn, {"ok": True})
            elif op == "ping":  # a prestart asks whether this server can serve (stale: it ends, as for a spawn)
                fresh = _code_stamp() == self.stamp
                if not fresh:
                    self.close()
                _reply(conn, {"ok": True} if fresh else {"error": "stale"})
            elif op == "spawn":
                keep = self._spawn(conn, request, fds)
            else:
                _reply(conn, {"error": f"unknown op {op!r}"})
        except (OSError, ValueError, KeyError) as exc:
            log.warning("warm server: a bad request: %s", exc)
        finally:
            for fd in fds:
                os.close(fd)
            if not keep:
                conn.close()

    def _spawn(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> bool:
        if len(fds) != 3:
            _reply(conn, {"error": f"a spawn request passes 3 fds, not {len(fds)}"})
            return False
        if _code_stamp() != self.stamp:
            self.close()
            _reply(conn, {"error": "stale"})
            return False
        if threading.active_count() != 1:
            names = ", ".join(t.name for t in threading.enumerate())
            _reply(conn, {"error": f"the server has threads ({names}): it cannot fork safely"})
            return False
        owner = request.get("owner")
        if owner is None:  # a client that names none: the first live owner's
            owner = next(iter(self.owners.values()), None)
        if owner is None or not self._adopt(owner):
            _reply(conn, {"error": f"its owner {owner} is not running"})
            return False
        conn.settimeout(None)
        closing = [*self.owners, *([self.keeper_fd] if self.keeper_fd is not None else []),
                   *(c.pidfd for c in self.children.values())]
        socks = [s for s in (self.listener, *(c.conn for c in self.children.values())) if s is not None]
        # the child's command line, in place before the fork: ps never shows it as the server
        shown = [request["argv0"]] if "script" in request else ["-m", request["module"]]
        set_cmdline([sys.executable, *shown, *request["args"]])
        pid = os.fork()
        if pid == 0:  # the child never returns
            _child_main(request, fds, closing, [*socks, conn], os.getppid())
        set_cmdline(self.title)
        child = _Child(pid, os.pidfd_open(pid), conn, owner, request.get("exit_report"))
        self.children[pid] = child
        self.by_conn[conn.fileno()] = child
        self.poller.register(child.pidfd, select.POLLIN)
        self.poller.register(conn.fileno(), select.POLLIN | select.POLLHUP)
        self.fresh.update((child.pidfd, conn.fileno()))
        self.last_active = time.monotonic()
        _reply(conn, {"pid": pid})
        return True


def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _LEN.size:
        more = conn.recv(_LEN.size - len(data))
        if not more:
            raise ValueError("the request ended early")
        data += more
    (size,) = _LEN.unpack(data[: _LEN.size])
    if size > MAX_REQUEST:
        raise ValueError(f"a request of {size} bytes")
    body = data[_LEN.size:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ValueError("the request ended early")
        body += more
    return _parse_request(body), list(fds)


class BadRequest(ValueError):
    """A request to the warm server that is not one it serves (not JSON, or a wrong shape)."""


def _valid_report(report: Any) -> bool:
    if not isinstance(report, dict) or set(report) - {"tls"} != {"addr", "secret", "key"}:
        return False
    if not all(isinstance(v, str) and v for v in report.values()) or ":" not in report["addr"]:
        return False
    try:
        bytes.fromhex(report["secret"])
    except ValueError:
        return False
    host, _, port = report["addr"].rpartition(":")
    return bool(host) and port.isascii() and port.isdigit() and 0 < int(port) < 65536


def _parse_request(body: bytes) -> dict[str, Any]:
    """The request in ``body``: a JSON object with a string ``op``; a ``spawn`` names a
    ``module`` (str) or a ``script`` (an absolute path, with ``argv0``: the path as the
    command gave it), ``args`` (list of str), ``env`` (str -> str) and ``cwd`` (str), and
    optionally ``command`` (bool: a ``hora run`` command rank, :func:`hora.runners.rank.warm.child._run_command`),
    ``owner`` (a pid) and ``exit_report`` (``{"addr": "host:port", "secret": hex, "key": str}``, and
    ``"tls"``: the run's certificate in base64 when the run uses TLS).

    Raises:
        BadRequest: anything else.
    """
    try:
        request = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadRequest(f"a request that is not JSON: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        raise BadRequest("a request that is not an object with a string 'op'")
    if request["op"] == "spawn":
        script = request.get("script")
        if script is not None:  # a command rank's ``python SCRIPT ARGS``: an absolute path, and no module
            if not isinstance(script, str) or not os.path.isabs(script) or "module" in request:
                raise BadRequest("a spawn request whose script is not an absolute path (or that names a module too)")
            if not isinstance(request.get("argv0"), str) or request.get("command") is not True:
                raise BadRequest("a spawn request with a script but no argv0 string, or not a command")
        elif not isinstance(request.get("module"), str) or not request["module"]:
            raise BadRequest("a spawn request without a module name")
        if not isinstance(request.get("command", False), bool):
            raise BadRequest("a spawn request whose command flag is not a bool")
        args = request.get("args")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise BadRequest("a spawn request whose args are not a list of strings")
        env = request.get("env")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise BadRequest("a spawn request whose env is not a mapping of strings")
        if not isinstance(request.get("cwd"), str):
            raise BadRequest("a spawn request whose cwd is not a string")
        owner = request.get("owner")
        if owner is not None and (isinstance(owner, bool) or not isinstance(owner, int) or owner <= 0):
            raise BadRequest("a spawn request whose owner is not a pid")
        report = request.get("exit_report")
        if report is not None and not _valid_report(report):
            raise BadRequest("a spawn request whose exit_report is not {addr: 'host:port', secret: hex, key: str}")
    return request


def set_cmdline(argv: list[str]) -> bool:
    """Make ``ps`` and ``/proc/<pid>/cmdline`` show ``argv`` (as ``setproctitle`` does):
    write it over this process's own argument area, which
    the starter made long enough (:data:`hora.runners.rank.warm.client.TITLE_ROOM`). False (nothing written) when it does
    not fit or ``/proc`` cannot say where the area is."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
    except (OSError, IndexError, ValueError):
        return False
    # one line and a non-NUL last byte of the area: Linux then shows the line up to its NUL
    data = b" ".join(os.fsencode(a) for a in argv) + b"\0"
    if start <= 0 or len(data) >= end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start - 1, b"\0") + b" ", end - start)
    return True


def main(argv: list[str]) -> int:
    """Preload, listen, say ``ready`` on the fd, serve."""
    path, owner, idle, ready_fd = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    options = dict(a[2:].split("=", 1) for a in argv[4:] if a.startswith("--") and "=" in a)
    app, keeper = options.get("app") or None, int(options.get("keeper") or 0)
    title = [sys.executable, "-m", "hora.runners.rank.warm.server", path, str(owner)]
    set_cmdline(title)  # without the room for the children's
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.info("warm server %s: starting, pid %d", path, os.getpid())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server: Server | None = None
    try:
        try:
            from hora import settings
            from hora.runners.rank.warm.client import ENV_PRELOAD

            owner_fd = os.pidfd_open(owner)  # before the imports: the owner's pid is not reused meanwhile
            keeper_fd = os.pidfd_open(keeper) if app and keeper > 1 else None
            failed = _preload(settings.get(ENV_PRELOAD))
            gc.freeze()  # the preloaded objects: no child's collections walk (and copy) them
            server = Server(path, owner_fd, idle, title, owner, app, keeper_fd)
        except Exception as exc:
            os.write(ready_fd, f"error {type(exc).__name__}: {exc}\n".encode())
            raise
        try:
            os.write(ready_fd, f"ready {os.getpid()} {','.join(failed)}\n".encode())
        except OSError:  # the starter is gone (a prestart's Python worker that ended): serve the owner anyway
            log.info("warm server %s: its starter is gone; serving its owner", path)
        os.close(ready_fd)
        log.info("warm server %s: pid %d, owner %d, idle %gs, modules %d", path, os.getpid(), owner, idle,
                 len(sys.modules))
        server.serve()
        return 0
    finally:
        if server is not None:
            server.close()
            server._kill_all()
            with contextlib.suppress(OSError):  # a clean end leaves no log behind
                os.unlink(path[: -len(".sock")] + ".log")
            with contextlib.suppress(OSError):  # nor its start lock (warm._starting)
                os.unlink(path[: -len(".sock")] + ".lock")
        log.info("warm server %s: exiting", path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
