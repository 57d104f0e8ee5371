"""Elastic ``hora run --host-discovery-script``: ranks join and leave a running job.

A real ``hora run`` with a discovery script that prints a hosts file the test rewrites.
``localhost`` and ``127.0.0.1`` are two hosts of this machine as Horovod's rules see them
(a failing worker blacklists its host, so a kill needs a second host to go on with).
"""

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
import pytest

HERE = Path(__file__).parent
COUNTER = HERE / "elastic_counter.py"


class HoraRun:
    """``hora run`` in the background; its output lines are read as they come."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
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


def _worker_pid(name: str) -> int:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(COUNTER) in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get("HORA_ELASTIC_WORKER") == name:
                return proc.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process of worker {name}")


def _no_counter_processes(within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if str(COUNTER) in " ".join(p.info["cmdline"] or [])]
        if not left:
            return
        assert time.monotonic() < deadline, f"worker processes left: {left}"
        time.sleep(0.2)


@pytest.mark.timeout(600)
def test_ranks_join_leave_and_survive_a_kill(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    stop = tmp_path / "stop"
    run = HoraRun(["--min-np", "1", "--max-np", "3", "--host-discovery-script", str(script), "--elastic-timeout", "120",
                   sys.executable, str(COUNTER), str(stop)], tmp_path)
    try:
        run.wait_for(r"step=3 size=2 ")
        hosts.write_text("localhost:2\n127.0.0.1:1\n")  # a slot is added
        joined = run.wait_for(r"first step=(\d+) worker=127\.0\.0\.1\[0\]")
        assert int(joined.group(1)) > 3  # the new worker took the survivors' state
        run.wait_for(r"step=\d+ size=3 ")
        mark = len(run.lines)
        hosts.write_text("localhost:1\n127.0.0.1:1\n")  # a slot is removed: localhost[1] leaves
        run.wait_for(r"step=\d+ size=2 ", after=mark)
        mark = len(run.lines)
        os.kill(_worker_pid("127.0.0.1[0]"), signal.SIGKILL)  # a rank is killed
        run.wait_for(r"step=\d+ size=1 ", after=mark)
        stop.touch()
        code = run.finish()
    finally:
        run.kill()
    text = "\n".join(run.lines)
    assert code == 0, text[-4000:]
    sizes = [int(s) for s in re.findall(r"<stdout>:step=\d+ size=(\d) rank=0 ", text)]
    assert [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]] == [2, 3, 2, 1]
    for size in (3, 2, 1):  # the reset callbacks ran with the new size
        assert re.search(rf"<stdout>:reset size={size} rank=0", text)
    assert "host 127.0.0.1 is blacklisted" in text
    assert "127.0.0.1[0]" in text and "signal 9 (SIGKILL)" in text
    # every committed step counted the ranks of its round exactly once
    committed: dict[int, int] = {}
    for step, size in re.findall(r"<stdout>:step=(\d+) size=(\d) rank=0 ", text):
        committed[int(step)] = int(size)  # a step redone after a restore keeps its last size
    (done,) = re.findall(r"<stdout>:done rank=0 size=1 step=(\d+) total=([\d.]+) weights=", text)
    assert int(done[0]) == max(committed) and sorted(committed) == list(range(1, max(committed) + 1))
    assert float(done[1]) == sum(committed.values())
    _no_counter_processes()


def _discovery_error(tmp_path, body: str, *extra: str) -> str:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    res = subprocess.run([sys.executable, "-m", "hora", "run", *extra, "--host-discovery-script", str(script),
                          "true"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2, res.stderr
    return res.stderr


@pytest.mark.timeout(120)
def test_bad_discovery_and_bounds_are_usage_errors(tmp_path):
    err = _discovery_error(tmp_path, "echo localhost:2\necho 'not a host line!'\n", "--min-np", "1")
    assert "discover.sh" in err and "output line 2 'not a host line!'" in err
    err = _discovery_error(tmp_path, "echo localhost:x\n", "--min-np", "1")
    assert "output line 1 'localhost:x'" in err and "integer slots" in err
    err = _discovery_error(tmp_path, "echo broken >&2\nexit 3\n", "--min-np", "1")
    assert "failed with exit code 3: broken" in err
    err = _discovery_error(tmp_path, "echo localhost:2\n", "--min-np", "3")
    assert "offers 2 slot(s) (localhost:2) at start; the run needs 3" in err
    err = _discovery_error(tmp_path, "echo localhost:4\n", "--min-np", "3", "--max-np", "2")
    assert "--min-np 3 is greater than --max-np 2" in err
    err = _discovery_error(tmp_path, "echo localhost:4\n", "--min-np", "1", "--blacklist-cooldown-range", "9", "3")
    assert "--blacklist-cooldown-range 9 3" in err
    res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", "--min-np", "1", "true"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--min-np need(s) --host-discovery-script" in res.stderr
