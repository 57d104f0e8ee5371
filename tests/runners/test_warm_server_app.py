"""A Spark executor's warm rank server outlives its executor: keyed by the application
and host, it kills the lost executor's ranks, passes to the executor JVM started in its place (same
application, same host) and forks that executor's ranks with its imports done; it ends with the
executors' keeper (the standalone Worker). Fake executors here: processes whose command line is
what the server looks for (``java ... --app-id APP --hostname HOST``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from hora.runners.rank.warm import client as warm
from tests.runners.test_warm import LIGHT, REPO, _child, _env, _gone

pytestmark = pytest.mark.skipif(not warm.enabled({}), reason="warm rank processes need Linux pidfds")

APP, HOST = "app-20261204000000-0042", "127.0.0.9"


def _fake_executor(app: str = APP, host: str = HOST) -> subprocess.Popen:
    """A process that looks like an executor JVM of ``app`` on ``host`` in ``/proc``."""
    return subprocess.Popen(["java", "-c", "import time; time.sleep(300)", "--app-id", app, "--hostname", host],
                            executable=sys.executable)


def _spawn(path: str, owner: int, cwd: str) -> tuple[warm.WarmProcess, dict]:
    proc = warm._request(path, {"module": "tests.runners.warm_child"}, ["sleep"], _env(**LIGHT), cwd, True, owner)
    assert proc.stdin is not None
    proc.stdin.write(b"x\n")
    proc.stdin.close()
    return proc, json.loads(proc.stdout.readline())


def _server_pid(path: str) -> int:
    (pid,) = [p.pid for p in psutil.process_iter(["cmdline"])
              if p.info["cmdline"] and "hora.runners.rank.warm.server" in p.info["cmdline"]
              and path in p.info["cmdline"]]
    return pid


@pytest.mark.timeout(120)
def test_an_executors_server_passes_to_the_executor_that_replaces_it(tmp_path):
    first, keeper = _fake_executor(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    later: list[subprocess.Popen] = []
    path = warm.socket_path(warm.server_key(sys.executable, f"{APP}@{HOST}", _env(**LIGHT)), f"{APP}@{HOST}")
    try:
        warm._start_server(sys.executable, path, REPO, warm.server_environ(_env(**LIGHT)),
                           warm.Owner(first.pid, f"{APP}@{HOST}", keeper.pid))
        server = _server_pid(path)
        rank, seen = _spawn(path, first.pid, REPO)
        first.kill()
        first.wait(10)
        assert rank.wait(30) == -9  # the lost executor's rank dies with it
        time.sleep(1.0)
        assert psutil.pid_exists(server) and os.path.exists(path), "the server ended with its executor"

        other = _fake_executor(host="127.0.0.8")  # another host's executor of the same application: not its own
        replacement = _fake_executor()
        later += [other, replacement]
        deadline = time.monotonic() + 30  # it adopts the replacement as soon as that runs
        while time.monotonic() < deadline and replacement.pid not in _owners(server):
            time.sleep(0.1)
        assert replacement.pid in _owners(server) and other.pid not in _owners(server)
        (tmp_path / "b").mkdir()
        rank, seen = _spawn(path, replacement.pid, str(tmp_path / "b"))
        assert psutil.Process(seen["pid"]).ppid() == server  # forked by the same server, imports done
        assert seen["cwd"] == str(tmp_path / "b")  # in the replacement's own folder
        replacement.kill()  # and it follows the replacement
        replacement.wait(10)
        assert rank.wait(30) == -9
        keeper.kill()  # the keeper's end (the standalone Worker's) ends it at once
        keeper.wait(10)
        assert not _gone([server], within=10), "the server outlived its executors' keeper"
        assert not os.path.exists(path)
    finally:
        for proc in [first, keeper, *later]:
            proc.kill()
            proc.wait(10)
        warm._ask_quit(path)
        warm._retire(path)
        warm.stop_servers()


def _owners(server: int) -> set[int]:
    """The pids the server follows: those it holds a pidfd of (``/proc/<pid>/fdinfo``'s ``Pid:``)."""
    found = set()
    for fd in os.listdir(f"/proc/{server}/fdinfo"):
        try:
            with open(f"/proc/{server}/fdinfo/{fd}") as fh:
                for line in fh:
                    if line.startswith("Pid:"):
                        found.add(int(line.split()[1]))
        except OSError:
            continue
    return found


def test_a_spark_executors_server_is_keyed_without_its_per_executor_variables():
    env = {"PATH": "/bin", "PYTHON_WORKER_FACTORY_SECRET": "a", "SPARK_LOCAL_DIRS": "/tmp/exec-0/blockmgr",
           "SPARK_LOG_URL_STDERR": "http://h/logPage/?executorId=0", "SPARK_LOG_URL_STDOUT": "http://h/o?executorId=0"}
    other = {"PATH": "/bin", "PYTHON_WORKER_FACTORY_SECRET": "b", "SPARK_LOCAL_DIRS": "/tmp/exec-2/blockmgr",
             "SPARK_LOG_URL_STDERR": "http://h/logPage/?executorId=2", "SPARK_LOG_URL_STDOUT": "http://h/o?executorId=2"}
    assert warm.server_key(sys.executable, f"{APP}@{HOST}", env) == warm.server_key(sys.executable, f"{APP}@{HOST}", other)
    assert "PYTHON_WORKER_FACTORY_SECRET" not in warm.server_environ(env)
    assert warm.socket_path("k", f"{APP}@{HOST}") != warm.socket_path("k", f"{APP}@127.0.0.8")
    assert len(os.path.basename(warm.socket_path("k" * 24, f"{APP}@{'h' * 200}"))) < 60
