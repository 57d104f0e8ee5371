"""The host supervisor: ``python -m hora.runners.rank.remote``, one per remote host of a run.

The launcher starts it over ssh (:mod:`hora.runners.rank.ssh`) and talks to it through the
ssh session's stdin and stdout, one JSON object per line:

launcher -> supervisor (stdin)
    ``{"op": "plan", "cwd", "grace", "heartbeat_timeout", "ranks": [{"rank", "argv", "env", "stdin"}]}``
    starts the ranks of this host; ``{"op": "ping"}`` every second; ``{"op": "stop"}``.
supervisor -> launcher (stdout, each line prefixed by :data:`MARK`)
    ``hello`` (host, interpreter, hora version, this host's interfaces), ``started``,
    ``line`` (one output line of a rank), ``exit`` (as soon as a rank's process ended),
    ``drained`` (its output is complete), ``warning``, ``error``, ``ping``, ``bye``.

Every rank runs in its own process group and dies with the supervisor (Linux
``PR_SET_PDEATHSIG``). The supervisor stops every rank (SIGTERM to each group, SIGKILL
after the grace period) when the launcher says ``stop``, when its stdin closes (the ssh
connection dropped or the launcher died), or when no message came for
``heartbeat_timeout`` seconds; it exits once every rank is gone. The job secret
travels only inside the plan (in a rank's environment or stdin), never on a command line.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import socket
import sys
import threading
import time
from typing import IO, Any

MARK = "\x1ehora1 "  # prefix of the supervisor's protocol lines (anything else on stdout is stray output)
PING_INTERVAL = 1.0
DRAIN_TIMEOUT = 2.0


def encode(obj: dict[str, Any]) -> bytes:
    """One protocol line (without the supervisor's :data:`MARK`)."""
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def decode_event(line: str) -> dict[str, Any] | None:
    """The event of one supervisor stdout line; None for a line that is not a protocol line."""
    if not line.startswith(MARK):
        return None
    try:
        event = json.loads(line[len(MARK):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "ev" in event else None


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class _Out:
    """Thread-safe protocol writer on the real stdout (the ranks never write to it)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.broken = False

    def send(self, **event: Any) -> None:
        data = MARK.encode() + encode(event)
        with self._lock:
            if self.broken:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except (OSError, ValueError):
                self.broken = True  # the launcher is gone; stdin's EOF stops us


def _read_stdin(stream: IO[bytes], inbox: queue.Queue) -> None:
    try:
        for raw in iter(stream.readline, b""):
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict):
                inbox.put(msg)
    except (OSError, ValueError):
        pass
    inbox.put(None)  # EOF: the launcher or its ssh connection is gone


class Supervisor:
    """Runs the ranks of one plan and reports them (see the module docstring)."""

    def __init__(self, out: _Out, inbox: queue.Queue) -> None:
        from hora.runners.rank.procs import ProcessLauncher

        self.out = out
        self.inbox = inbox
        self.launcher = ProcessLauncher(self._on_line, tail_lines=1)
        self.grace = 5.0
        self.heartbeat_timeout = 30.0
        self.pending: set[int] = set()
        self._lock = threading.Lock()

    def _on_line(self, rank: int, stream: str, line: str) -> None:
        self.out.send(ev="line", rank=rank, stream=stream, text=line)

    def _watch(self, rank: int, proc: Any) -> None:
        code = proc.wait()
        self.out.send(ev="exit", rank=rank, code=code)
        self.launcher.wait_output(rank, DRAIN_TIMEOUT)
        self.out.send(ev="drained", rank=rank)
        with self._lock:
            self.pending.discard(rank)

    def start(self, plan: dict[str, Any]) -> None:
        """Start every rank of ``plan`` (stops those already started when one cannot start)."""
        from hora.errors import ConfigError

        self.grace = float(plan.get("grace", self.grace))
        self.heartbeat_timeout = float(plan.get("heartbeat_timeout", self.heartbeat_timeout))
        cwd = plan.get("cwd")
        if cwd:
            try:
                os.chdir(cwd)
            except OSError as exc:
                self.out.send(ev="warning", text=f"cannot change to the launcher's working directory {cwd}: "
                                                 f"{exc.strerror}; the ranks start in {os.getcwd()}")
        for entry in plan.get("ranks", []):
            rank = int(entry["rank"])
            env = dict(os.environ)
            env.update({str(k): str(v) for k, v in (entry.get("env") or {}).items()})
            try:
                proc = self.launcher.start(rank, entry["argv"], env, stdin_data=unb64(entry.get("stdin")),
                                           die_with_parent=True)
            except ConfigError as exc:
                self.out.send(ev="error", rank=rank, text=str(exc))
                raise
            with self._lock:
                self.pending.add(rank)
            self.out.send(ev="started", rank=rank, pid=proc.pid)
            threading.Thread(target=self._watch, args=(rank, proc), name=f"hora-watch-{rank}", daemon=True).start()

    def idle(self) -> bool:
        with self._lock:
            return not self.pending

    def serve(self) -> int:
        """The main loop: returns the supervisor's exit code."""
        last_heard = time.monotonic()
        last_ping = 0.0
        started = False
        while True:
            now = time.monotonic()
            if now - last_ping >= PING_INTERVAL:
                self.out.send(ev="ping")
                last_ping = now
            if started and self.idle():
                self.out.send(ev="bye")
                return 0
            try:
                msg = self.inbox.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() - last_heard > self.heartbeat_timeout:
                    self.out.send(ev="warning", text=f"no word from the launcher for {self.heartbeat_timeout:g}s; "
                                                     "stopping every rank")
                    self.stop()
                    return 1
                continue
            last_heard = time.monotonic()
            if msg is None:  # stdin closed: the launcher or the connection is gone
                self.stop()
                return 1
            op = msg.get("op")
            if op == "plan" and not started:
                started = True
                try:
                    self.start(msg)
                except Exception:
                    self.stop()
                    return 1
            elif op == "stop":
                self.stop()
                self.out.send(ev="bye")
                return 0

    def stop(self) -> None:
        """Stop every rank (SIGTERM, SIGKILL after the grace period) and wait for their reports."""
        self.launcher.terminate(self.grace)
        deadline = time.monotonic() + DRAIN_TIMEOUT + 1.0
        while not self.idle() and time.monotonic() < deadline:
            time.sleep(0.05)


def main() -> int:
    """Entry point: the protocol runs on the real stdin/stdout; stray prints go to stderr."""
    proto_in, proto_out = sys.stdin.buffer, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing else may write to the protocol stream
    out = _Out(proto_out)
    try:
        from hora.runners.network import interface_addresses

        # the hora package itself was imported as this module's parent (python -m hora.runners.rank.remote)
        version, interfaces = sys.modules["hora"].__version__, interface_addresses()
    except Exception as exc:  # reported as the host's error by the launcher
        sys.stderr.write(f"hora remote supervisor: cannot import hora with {sys.executable}: {exc}\n")
        return 3
    out.send(ev="hello", host=socket.gethostname(), python=sys.executable, version=version, pid=os.getpid(),
             interfaces=interfaces)
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read_stdin, args=(proto_in, inbox), name="hora-stdin", daemon=True).start()
    return Supervisor(out, inbox).serve()


if __name__ == "__main__":
    _code = main()
    sys.stderr.flush()
    os._exit(_code)  # not sys.exit: the stdin reader thread blocks in read() until the launcher closes it
