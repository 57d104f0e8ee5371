"""Reaching remote hosts with OpenSSH, and the launcher's side of a host supervisor.

The ssh command line is horovodrun's: ``-o PasswordAuthentication=no -o
StrictHostKeyChecking=no`` (a host seen for the first time is accepted and recorded in
``known_hosts``), ``-p`` / ``-i`` from ``--ssh-port`` / ``--ssh-identity-file``, plus
``BatchMode=yes`` (never a prompt that would hang), a connect timeout and keep-alives.
The user's ``~/.ssh/config`` applies as always (aliases, ``User``, ``ProxyJump``, ...);
options given on the command line win over it, and ``HORA_SSH_ARGS`` (extra ssh
arguments, shell-quoted) comes first, so it can override hora's own ``-o`` choices.

:class:`SshHost` runs ``python -m hora.runners.rank.remote`` on one host through one ssh
session and relays the protocol of :mod:`hora.runners.rank.remote`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hora import settings
from hora.errors import ConfigError
from hora.runners.rank import remote

log = logging.getLogger(__name__)

ENV_SSH_ARGS = "HORA_SSH_ARGS"
SSH_EXIT_ERROR = 255


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts.

    Attributes:
        port: ``-p`` on every host (default: ssh's own, usually 22 or ~/.ssh/config's).
        identity_file: ``-i`` private key file.
        extra_args: more ssh arguments (default: ``HORA_SSH_ARGS``), placed first.
        connect_timeout: seconds ssh may take to connect.
    """

    port: int | None = None
    identity_file: str | None = None
    extra_args: tuple[str, ...] = ()
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 0 < self.port < 65536):
            raise ConfigError(f"ssh port must be an integer in 1..65535, got {self.port!r}")
        if self.identity_file is not None:
            path = os.path.expanduser(os.fspath(self.identity_file))
            if not os.path.isfile(path):
                raise ConfigError(f"ssh identity file {self.identity_file!r} does not exist")
            object.__setattr__(self, "identity_file", os.path.abspath(path))
        if not self.connect_timeout > 0:
            raise ConfigError(f"ssh connect timeout must be > 0 seconds, got {self.connect_timeout!r}")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))

    @classmethod
    def from_environ(cls, port: int | None = None, identity_file: str | None = None,
                     connect_timeout: float = 10.0) -> SshOptions:
        """Options with ``HORA_SSH_ARGS`` as the extra arguments.

        Raises:
            ConfigError: ``HORA_SSH_ARGS`` is not shell-quoted text, or a bad port / key file.
        """
        raw = settings.get(ENV_SSH_ARGS)
        try:
            extra = tuple(shlex.split(raw))
        except ValueError as exc:
            raise ConfigError(f"{ENV_SSH_ARGS}={raw!r} cannot be split into arguments: {exc}") from None
        return cls(port=port, identity_file=identity_file, extra_args=extra, connect_timeout=connect_timeout)

    def common_args(self) -> list[str]:
        """Everything before the destination, except hora's ``-o`` session options."""
        args = list(self.extra_args)
        if self.port is not None:
            args += ["-p", str(self.port)]
        if self.identity_file is not None:
            args += ["-i", self.identity_file]
        return args

    def argv(self, host: str, remote_command: str) -> list[str]:
        """``ssh ... host remote_command`` (no tty, no X11, batch mode, keep-alives)."""
        return [
            "ssh", *self.common_args(),
            "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}", "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=6", "-o", "LogLevel=ERROR", "-T", "-x",
            host, remote_command,
        ]

    def ssh_args_for_launcher(self) -> str:
        """The arguments as one shell string (for ``mpiexec -launcher-exec`` wrappers)."""
        return " ".join(shlex.quote(a) for a in self.argv("HOST", "CMD")[1:-2])

    def destination_hostname(self, host: str) -> str:
        """The host name ssh really connects to for ``host`` (``ssh -G``: ~/.ssh/config's
        ``HostName`` of an alias); ``host`` itself when ssh cannot tell."""
        try:
            res = subprocess.run(["ssh", "-G", *self.common_args(), host], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return host
        for line in res.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key.lower() == "hostname" and value.strip():
                return value.strip()
        return host


def remote_command(python: str, pythonpath: str | None) -> str:
    """The shell command that starts the host supervisor on a remote host."""
    env = f"env PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""
    return f"exec {env}{shlex.quote(python)} -u -m hora.runners.rank.remote"


class SshHost:
    """One remote host: an ssh session running the host supervisor.

    Args:
        host: the ssh destination (as the user wrote it).
        options: the ssh options.
        python: the interpreter to run on the host.
        on_event: called (from a reader thread) with every event the supervisor sends.
        on_stray: called with lines on the session that are not protocol lines
            (``stdout`` from the login shell, ``stderr`` from ssh or the supervisor).
    """

    def __init__(self, host: str, options: SshOptions, python: str, on_event: Callable[[dict], None],
                 on_stray: Callable[[str, str], None]) -> None:
        self.host = host
        self.options = options
        self.python = python
        self._on_event = on_event
        self._on_stray = on_stray
        self.hello: dict[str, Any] | None = None
        self._hello_event = threading.Event()
        self.stderr_tail: deque[str] = deque(maxlen=60)
        self.last_heard = time.monotonic()
        self.said_bye = False
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.proc: subprocess.Popen | None = None

    def connect(self) -> None:
        """Start the ssh session (returns at once; :meth:`wait_hello` waits for the supervisor).

        Raises:
            ConfigError: ssh is not installed.
        """
        argv = self.options.argv(self.host, remote_command(self.python, os.environ.get("PYTHONPATH")))
        log.info("ssh to %s: %s", self.host, shlex.join(argv))
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True, close_fds=True)
        except FileNotFoundError:
            raise ConfigError(f"cannot reach host {self.host!r}: the 'ssh' command is not installed here") from None
        for target, name in ((self._read_stdout, "out"), (self._read_stderr, "err"), (self._write, "in")):
            t = threading.Thread(target=target, name=f"hora-ssh-{self.host}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    # -- reading ---------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            event = remote.decode_event(line)
            if event is None:
                self._on_stray("stdout", line)
                continue
            self.last_heard = time.monotonic()
            kind = event.get("ev")
            if kind == "hello":
                self.hello = event
                self._hello_event.set()
            elif kind == "bye":
                self.said_bye = True
            if kind != "ping":
                try:
                    self._on_event(event)
                except Exception:  # a broken sink must not stop the reader
                    log.exception("handling an event of host %s failed", self.host)
        self._hello_event.set()  # the session ended: wake wait_hello

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.stderr_tail.append(line)
            self._on_stray("stderr", line)

    # -- writing ---------------------------------------------------------------------------
    def _write(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        stdin = self.proc.stdin
        while True:
            try:
                data = self._outbox.get(timeout=remote.PING_INTERVAL)
            except queue.Empty:
                data = remote.encode({"op": "ping"})
            try:
                if data is None:
                    stdin.close()
                    return
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):
                return  # the session is gone; its exit code tells why

    def send(self, **msg: Any) -> None:
        """Queue one message for the supervisor."""
        self._outbox.put(remote.encode(msg))

    # -- life cycle -------------------------------------------------------------------------
    def wait_hello(self, timeout: float) -> None:
        """Wait until the supervisor said hello.

        Raises:
            HostUnreachable: ssh failed, the supervisor could not start, or no hello came
                within ``timeout`` seconds (the message quotes ssh's or the host's own error).
        """
        self._hello_event.wait(timeout)
        if self.hello is not None:
            return
        code = None
        if self.proc is not None:
            try:  # the session ended (its stdout closed): its exit code comes a moment later
                code = self.proc.wait(timeout=5.0 if self._hello_event.is_set() else 0.01)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            raise HostUnreachable(self.host, None, f"no answer from ssh to {self.host} within {timeout:g}s "
                                                   "(raise --start-timeout if the host is slow to accept)")
        self.wait_closed(2.0)
        raise HostUnreachable(self.host, code, self.failure_text(code))

    def failure_text(self, code: int | None) -> str:
        """Why the session ended, in ssh's or the host's words."""
        tail = "\n".join(t for t in self.stderr_tail if t.strip())
        if code == SSH_EXIT_ERROR:
            what = f"ssh to {self.host} failed (exit code 255)"
        elif self.hello is None:
            what = (f"host {self.host}: the hora supervisor did not start with the interpreter {self.python} "
                    f"(exit code {code}); is hora installed there?")
        else:
            what = f"host {self.host}: the ssh session ended with exit code {code}"
        return f"{what}: {tail}" if tail else what

    def exit_code(self) -> int | None:
        """ssh's exit code, None while the session runs."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """Ask the supervisor to stop every rank of this host (returns at once)."""
        self.send(op="stop")

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the session ended and its output was read; True if it did."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        for t in self._threads[:2]:
            t.join(timeout=2.0)
        return True

    def kill(self) -> None:
        """End the ssh session: the supervisor sees its stdin close and stops every rank."""
        self._outbox.put(None)
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.proc.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=2.0)


class HostUnreachable(Exception):
    """A remote host could not be reached or could not start hora (internal; turned into a Failure)."""

    def __init__(self, host: str, code: int | None, text: str) -> None:
        super().__init__(text)
        self.host, self.code, self.text = host, code, text


def check_reachable(hosts: list[str], options: SshOptions, timeout: float) -> None:
    """Run ``ssh host true`` on every host at once (horovodrun's check before a launch that
    hands ssh to another program, such as mpiexec, which may exit before it relays ssh's
    own words).

    Raises:
        HostUnreachable: the first host (in the order given) that did not answer, with ssh's
            words or the timeout.
    """
    procs = {h: subprocess.Popen(options.argv(h, "true"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True) for h in hosts}
    deadline = time.monotonic() + timeout
    failed: HostUnreachable | None = None
    for h, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed = failed or HostUnreachable(h, None, f"no answer from ssh to {h} within {timeout:g}s")
            continue
        if proc.returncode != 0 and failed is None:
            tail = "\n".join(t for t in err.splitlines() if t.strip())
            what = f"ssh to {h} failed (exit code {proc.returncode})"
            failed = HostUnreachable(h, proc.returncode, f"{what}: {tail}" if tail else what)
    if failed is not None:
        raise failed


__all__ = ["SshOptions", "SshHost", "HostUnreachable", "check_reachable", "remote_command", "ENV_SSH_ARGS"]
