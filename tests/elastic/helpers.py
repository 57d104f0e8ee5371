"""Helpers of the elastic tests: ``hora run`` in the background, read line by line, and its workers."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


class HoraRun:
    """``hora run`` in the background; its output lines are read as they come."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "hora", "run", *args], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 180.0, after: int = 0) -> re.Match:
        """The first line (from index ``after``) matching ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = after
        while True:
            while i < len(self.lines):
                m = regex.search(self.lines[i])
                if m:
                    return m
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n" +
                                     "\n".join(self.lines[-80:]))
            try:
                line = self._queue.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                if i >= len(self.lines):
                    raise AssertionError(f"hora run ended (code {self.proc.wait()}) before {pattern!r}; output:\n" +
                                         "\n".join(self.lines[-80:]))
            else:
                self.lines.append(line)

    def finish(self, timeout: float = 180.0) -> int:
        code = self.proc.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=10)
            if line is None:
                return code
            self.lines.append(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def worker_pid(script: Path, name: str) -> int:
    """The pid of the elastic worker ``name`` (``host[slot]``) running ``script``."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(script) in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get("HORA_ELASTIC_WORKER") == name:
                return proc.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process of worker {name}")


def no_processes_of(script: Path, within: float = 30.0) -> None:
    """Fail unless every process running ``script`` is gone within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if str(script) in " ".join(p.info["cmdline"] or [])]
        if not left:
            return
        assert time.monotonic() < deadline, f"worker processes left: {left}"
        time.sleep(0.2)


def discovery_script(folder: Path, hosts: str) -> tuple[Path, Path]:
    """``(script, hosts file)``: a discovery script that prints the hosts file (initially ``hosts``)."""
    hosts_file = folder / "hosts.txt"
    hosts_file.write_text(hosts)
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return script, hosts_file


def kill_then_stop(run: HoraRun, script: Path, worker: str, stop: Path, size_after: int) -> tuple[int, str]:
    """SIGKILL ``worker``, wait until training goes on with ``size_after`` ranks, then ask the
    ranks to stop; ``(exit code of hora run, its whole output)``."""
    mark = len(run.lines)
    os.kill(worker_pid(script, worker), signal.SIGKILL)
    run.wait_for(rf"step=\d+ size={size_after} ", after=mark)
    stop.touch()
    code = run.finish()
    return code, "\n".join(run.lines)
