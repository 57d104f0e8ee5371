"""Warm rank processes (hora.runners.rank.warm.client): a rank forked by the warm server is what a
fresh ``python -m MODULE`` would be, with torch and torch._dynamo imported already; the
server ends with its owner and after its idle time; a server that cannot start means a
plain subprocess; Dask ranks start warm unless HORA_WARM_WORKERS=0; local function ranks (hora.runners.run,
hora.run, local fits) fork from the launching process's server unless HORA_WARM_LOCAL=0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import hora.runners as hr
from hora.runners.rank.warm import client as warm
from hora.runners.rank.procs import ProcessLauncher
from hora.runners.rank.warm.client import WarmProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIGHT = {"HORA_WARM_PRELOAD": "json"}  # a server that starts in a blink (another key, too)

pytestmark = pytest.mark.skipif(not warm.enabled({}), reason="warm rank processes need Linux pidfds")


def _child(action: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.runners.warm_child", action, *args]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_WARM")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _gone(pids: list[int], within: float = 30.0) -> list[int]:
    """The pids still running (not zombies) after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def servers():
    """Starts the test with no warm server of this process (an earlier test's local runs leave theirs,
    now that local ranks are warm), then stops the servers this test started and checks that they are gone."""
    warm.stop_servers()
    started: list[int] = []
    yield started
    started += [p.pid for p in [*warm._servers.values(), *warm._retired]]
    warm.stop_servers()
    assert not _gone(started), "warm servers outlived their test"


def _lines(lines: list[tuple[int, str, str]], rank: int, stream: str) -> list[str]:
    return [text for r, s, text in lines if r == rank and s == stream]


@pytest.mark.timeout(120)
def test_a_warm_rank_is_a_fresh_process_with_its_imports_done(tmp_path, servers):
    lines: list[tuple[int, str, str]] = []
    launcher = ProcessLauncher(lambda r, s, text: lines.append((r, s, text)))
    cwd = str(tmp_path)
    proc = launcher.start(0, _child("exit", "3"), _env(HORA_TEST_WARM_PROBE="a"), stdin_data=b"hello\n", cwd=cwd,
                          warm={})
    assert isinstance(proc, WarmProcess)
    assert proc.wait(60) == 3
    launcher.wait_output(0)
    first = json.loads(_lines(lines, 0, "stdout")[0])
    assert first["preloaded"] == ["hora.native.ops", "torch", "torch._dynamo"]  # before its own first import
    assert first["stdin"] == "hello" and first["cwd"] == cwd and first["probe"] == "a"
    assert first["pid"] == first["pgid"] == first["sid"] == proc.pid  # its own session, as start_new_session
    assert _lines(lines, 0, "stderr") == ["to stderr"]

    # another HORA_* value is the same server; a signal the rank sends itself is reported as -N
    proc = launcher.start(1, _child("signal", "10"), _env(HORA_TEST_WARM_PROBE="b"), cwd=cwd, warm={})
    assert isinstance(proc, WarmProcess) and proc.wait(60) == -10
    launcher.wait_output(1)
    second = json.loads(_lines(lines, 1, "stdout")[0])
    assert second["probe"] == "b" and second["random"] != first["random"]  # re-seeded
    assert len(warm._servers) == 1

    # a running rank looks like the process it stands for, and the launcher stops its group
    proc = launcher.start(2, _child("sleep"), _env(), cwd=cwd, warm={})
    assert isinstance(proc, WarmProcess)
    deadline = time.monotonic() + 60
    while not _lines(lines, 2, "stdout") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(proc.pid).cmdline() == _child("sleep")
    assert psutil.Process(proc.pid).parent().parent().pid == os.getpid()  # rank -> server -> its supervisor
    assert proc.poll() is None
    launcher.terminate(grace=5.0, ranks=[2])
    assert proc.returncode == -15

    # a variable the rank sets before its imports is part of the key: another server
    proc = launcher.start(3, _child("exit", "0"), _env(), cwd=cwd, warm=LIGHT)
    assert isinstance(proc, WarmProcess) and proc.wait(60) == 0
    launcher.wait_output(3)
    assert json.loads(_lines(lines, 3, "stdout")[0])["preloaded"] == []
    assert len(warm._servers) == 2
    launcher.terminate(grace=1.0)


_OWNER = textwrap.dedent("""
    import json, sys
    from hora.runners.rank.warm import client as warm
    p = warm.spawn([sys.executable, "-m", "tests.runners.warm_child", "sleep"], dict(__import__("os").environ),
                   stdin=False)
    print(json.dumps({"server": [s.pid for s in warm._servers.values()], "child": p.pid}), flush=True)
    sys.stdin.read()
""")


@pytest.mark.timeout(120)
def test_a_server_ends_with_its_owner_after_its_idle_time_and_when_its_code_changes(tmp_path, servers):
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], env=_env(**LIGHT), cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        started = json.loads(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait(10)
    assert len(started["server"]) == 1
    assert not _gone([*started["server"], started["child"]]), "the server or its rank outlived their owner"

    extra = tmp_path / "on-the-path"
    extra.mkdir()
    env = _env(HORA_WARM_IDLE_TIMEOUT="2", PYTHONPATH=f"{REPO}{os.pathsep}{extra}", **LIGHT)
    assert warm.spawn(_child("exit", "0"), env, REPO, stdin=False).wait(60) == 0
    (first,) = [p.pid for p in warm._servers.values()]
    os.utime(extra, (time.time() + 5, time.time() + 5))  # as an install into a sys.path folder does
    assert warm.spawn(_child("exit", "0"), env, REPO, stdin=False).wait(60) == 0
    (second,) = [p.pid for p in warm._servers.values()]
    assert second != first and not _gone([first]), "a stale server lived on"
    assert not _gone([second]), "the server outlived its idle time"
    assert not os.path.exists(warm.socket_path(warm.server_key(sys.executable, REPO, env), os.getpid()))


_SUPERVISOR = textwrap.dedent("""
    import json, os, sys
    from hora.runners.rank.warm import client as warm
    addr, secret, command = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    def report(rank):
        return {"addr": addr, "secret": secret, "key": "runner/exited/%d" % rank}
    def argv(*action):
        if command:  # a ``hora run`` command rank: its server's owner is this process's parent
            return [sys.executable, os.path.join("tests", "runners", "warm_child.py"), *action]
        return [sys.executable, "-m", "tests.runners.warm_child", *action]
    done = warm.spawn(argv("exit", "0"), dict(os.environ), stdin=False, command=command, exit_report=report(1))
    assert done.wait(60) == 0
    p = warm.spawn(argv("sleep"), dict(os.environ), stdin=False, command=command, exit_report=report(0))
    print(json.dumps({"server": [s.pid for s in warm._servers.values()], "child": p.pid}), flush=True)
    sys.stdin.read()
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [False, True], ids=["its-owner-and-supervisor-killed", "its-supervisor-killed"])
def test_a_rank_that_the_server_ends_is_reported_exited_to_its_driver(servers, command):
    """A supervisor SIGKILLed (a Spark task's Python worker; or with it the server's owner, an executor)
    cannot say that its rank's processes stopped: the server that kills the rank says it, to the driver
    service its spawn request named; a rank that ends by itself is reported by its supervisor, not
    the server."""
    from hora.runners.driver.service import DriverService

    secret = b"s" * 32
    service = DriverService(secret, 2, "exit-report", verbose=0)
    supervisor = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, service.addr, secret.hex(), "1" if command else "0"],
                                  env=_env(HORA_WARM_IDLE_TIMEOUT="3", **LIGHT), cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
    started: dict = {}
    try:
        started = json.loads(supervisor.stdout.readline())
        assert service.exited() == set()  # the rank that exited by itself: not the server's to report
        supervisor.kill()
        supervisor.wait(10)
        deadline = time.monotonic() + 30
        while service.exited() != {0} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.exited() == {0}, "no report of the killed rank (0), or one of the rank that exited itself (1)"
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        service.close()
    assert not _gone([started["child"], *started["server"]]), "the rank or its server outlived the test"


@pytest.mark.timeout(60)
def test_a_server_that_cannot_start_means_a_plain_subprocess(tmp_path, caplog, servers):
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\n[ "$2" = hora.runners.rank.warm.server ] && exit 7\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    launcher = ProcessLauncher(lambda *_: None)
    with caplog.at_level("WARNING", logger="hora.runners.rank.warm.client"):
        proc = launcher.start(0, [str(fake), "-m", "tests.runners.warm_child", "exit", "4"], _env(**LIGHT),
                              stdin_data=b"", warm={})
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 4
    assert "no warm rank process" in caplog.text and "did not start" in caplog.text
    launcher.terminate(grace=1.0)


def _dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


@pytest.mark.timeout(240)
def test_dask_ranks_start_warm_unless_turned_off(dask_client):
    assert hr.run(_dynamo_loaded, num_proc=2, backend="dask", client=dask_client, verbose=0) == [True, True]
    off = hr.run(_dynamo_loaded, num_proc=2, backend="dask", client=dask_client, verbose=0,
                 env={"HORA_WARM_WORKERS": "0"})
    assert off == [False, False]


@pytest.mark.timeout(60)
def test_exit_process_ends_as_the_interpreter_would_without_its_finalization():
    """A rank ends through exit_process (fresh or warm): non-daemon threads are joined, then
    the atexit handlers run, buffered output is flushed, and the code is the exit status."""
    code = textwrap.dedent("""
        import atexit, sys, threading, time
        from hora.pids import exit_process
        atexit.register(lambda: sys.stdout.write("atexit\\n"))
        threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread\\n"))).start()
        sys.stdout.write("main\\n")  # left in the buffer: exit_process must flush it
        exit_process(7)
        sys.stdout.write("never\\n")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=_env())
    assert out.returncode == 7, out.stderr
    assert out.stdout.split() == ["main", "thread", "atexit"]


@pytest.mark.timeout(30)
def test_a_request_sent_whole_is_not_followed_by_an_empty_send_a_closed_peer_refuses():
    """The server may read a request, answer and close before the client's next syscall (a
    loaded machine schedules it so): a client that then sent the empty rest of its frame got
    EPIPE in place of the answer."""
    import socket

    a, b = socket.socketpair()

    class AnsweredAtOnce(socket.socket):
        def send(self, data, *args):
            sent = super().send(data, *args)
            assert b.recv(4096) == data
            b.sendall(b'{"ok": true}\n')
            b.close()  # the peer is gone before the client writes again
            return sent

    conn = AnsweredAtOnce(fileno=a.detach())
    try:
        warm._send(conn, {"op": "quit"})
        assert warm._answer(conn, 5) == {"ok": True}
    finally:
        conn.close()


@pytest.mark.timeout(30)
def test_ranks_do_not_inherit_the_dask_workers_malloc_trim_threshold(monkeypatch):
    """A Dask worker runs with MALLOC_TRIM_THRESHOLD_ from its nanny's config, which pins
    glibc's mmap threshold (a training rank would page-fault through every buffer): its
    ranks start without it; a value the user set themselves stays."""
    import dask
    import distributed  # noqa: F401  (a Dask worker has it imported)

    from hora.runners.rank.supervise import worker_process_env

    injected = str(dask.config.get("distributed.nanny.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"])
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", injected)
    assert "MALLOC_TRIM_THRESHOLD_" not in worker_process_env()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert worker_process_env()["MALLOC_TRIM_THRESHOLD_"] == "1048576"


@pytest.mark.timeout(120)
def test_a_prestarted_server_is_the_one_spawn_uses_even_while_it_is_still_starting(tmp_path, servers):
    env = _env(**LIGHT)
    cwd = str(tmp_path)
    thread = warm.prestart(sys.executable, env, cwd)
    assert thread is not None
    # at once, while the prestart may still be starting it: spawn waits for that server, starts no second one
    proc = warm.spawn(_child("exit", "0"), env, cwd, stdin=False)
    assert isinstance(proc, WarmProcess) and proc.wait(60) == 0
    thread.join(60)
    assert len(warm._servers) == 1
    (server,) = warm._servers.values()
    assert psutil.Process(server.pid).is_running()
    assert warm.prestart(sys.executable, env, cwd) is None  # it serves already: nothing to start
    proc = warm.spawn(_child("sleep"), env, cwd, stdin=False)
    deadline = time.monotonic() + 60
    while psutil.Process(proc.pid).cmdline() != _child("sleep") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(proc.pid).ppid() == server.pid
    proc.kill()
    assert proc.wait(30) == -9
    assert warm.prestart(sys.executable, {**env, "HORA_WARM_WORKERS": "0"}, cwd) is None  # off: nothing


def _parent_and_owner() -> tuple[int, int]:
    """A rank's parent (the warm server it was forked from) and that server's owner."""
    server = psutil.Process(os.getppid())
    return server.pid, int(server.cmdline()[4])


def _warm_servers() -> set[int]:
    """The warm servers this test process started, directly or through its Spark executors (the
    other pytest-xdist process starts servers of its own meanwhile)."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "hora.runners.rank.warm.server" in " ".join(p.cmdline()[:3]):
                found.add(p.pid)
        except psutil.Error:  # gone, or a zombie
            pass
    return found


def _prestarted(launcher, env: dict[str, str], before: set[int], within: float = 120.0) -> set[int]:
    """``launcher.prestart(2, env)``, then the warm servers this process started since ``before``
    (waiting up to ``within`` s for the first)."""
    launcher.prestart(2, env)
    deadline = time.monotonic() + within
    fresh: set[int] = set()
    while not fresh and time.monotonic() < deadline:
        fresh = _warm_servers() - before
        time.sleep(0.2)
    return fresh


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_prestart_starts_the_executors_server_that_the_training_stage_forks_from(spark):
    from hora.runners.launchers.spark import SparkLauncher

    launcher = SparkLauncher(spark)
    env = {"PYTHONHASHSEED": "11"}  # a variable of the run's own: a new server key, so none runs yet
    before = _warm_servers()
    fresh = _prestarted(launcher, env, before)
    assert len(fresh) == 1, fresh  # one server for the executor, however many Python workers ran the job
    ranks = hr.run(_parent_and_owner, num_proc=2, backend=launcher, env=env, verbose=0)
    def info(pid):
        try:
            p = psutil.Process(pid)
            return (pid, p.ppid(), p.cmdline()[3:5], p.create_time())
        except psutil.Error as e:
            return (pid, repr(e))
    assert {server for server, _ in ranks} == fresh, (ranks, fresh, [info(p) for p in _warm_servers()])  # both ranks fork from the prestarted one
    (owner,) = {owner for _, owner in ranks}
    assert psutil.Process(owner).name() == "java"  # owned by the executor, not by a Python worker or daemon


@pytest.mark.timeout(240)
def test_dask_prestart_starts_the_server_of_each_rank_worker(dask_client):
    from hora.runners.launchers.dask import DaskLauncher

    launcher = DaskLauncher(dask_client)
    env = {"PYTHONHASHSEED": "7"}  # a variable of the run's own: a new server key, so none runs yet
    workers = [a for a, _ in launcher.pick_workers(2)]

    def servers_of_worker() -> list[int]:
        found = []
        for child in psutil.Process().children():
            try:
                if "hora.runners.rank.warm.server" in " ".join(child.cmdline()[:3]):
                    found.append(child.pid)
            except psutil.Error:  # gone, or a zombie
                pass
        return found

    before = dask_client.run(servers_of_worker, workers=workers)  # earlier tests' servers (other keys)
    launcher.prestart(2, env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fresh = {w: set(pids) - set(before[w]) for w, pids in dask_client.run(servers_of_worker, workers=workers).items()}
        if all(fresh.values()):
            break
        time.sleep(0.2)
    assert all(fresh.values()), (fresh, before)
    ranks = hr.run(_parent_and_owner, num_proc=2, backend="dask", client=dask_client, env=env, verbose=0)
    assert {server for server, _ in ranks} <= {pid for pids in fresh.values() for pid in pids}, (ranks, fresh)


def _rank_origin() -> dict:
    """Where a rank came from: its parent's pid and command line, its own command line, and
    whether torch._dynamo was imported before its own code (a warm server preloads it)."""
    me = psutil.Process()
    parent = me.parent()
    return {"dynamo": _dynamo_loaded(), "cmdline": " ".join(me.cmdline()), "parent": parent.pid,
            "parent_cmdline": parent.cmdline()}


@pytest.mark.timeout(240)
def test_local_function_ranks_fork_from_this_processs_server_unless_turned_off(monkeypatch):
    monkeypatch.delenv("HORA_WARM_LOCAL", raising=False)
    first = hr.run(_rank_origin, num_proc=2, run_id="warm-local-a", verbose=0)
    (server,) = {r["parent"] for r in first}  # both ranks forked by one server
    cmd = first[0]["parent_cmdline"]
    assert cmd[1:3] == ["-m", "hora.runners.rank.warm.server"] and int(cmd[4]) == os.getpid(), cmd  # this process's
    assert all(r["dynamo"] for r in first)  # imported before the rank's own code ran
    # a forked rank shows the command line of the rank it stands for, with the run id (the orphan checks' marker)
    assert all(f"{sys.executable} -m hora.runners.rank.main " in r["cmdline"] and "warm-local-a" in r["cmdline"]
               for r in first), first
    second = hr.run(_rank_origin, num_proc=2, run_id="warm-local-b", verbose=0, env={"HORA_CYCLE_TIME": "2"})
    assert {r["parent"] for r in second} == {server}  # the next run (other HORA_* values) reuses it
    off = hr.run(_rank_origin, num_proc=2, run_id="cold-local", verbose=0, env={"HORA_WARM_LOCAL": "0"})
    assert {r["parent"] for r in off} == {os.getpid()} and not any(r["dynamo"] for r in off)
    assert all("cold-local" in r["cmdline"] for r in off)
    monkeypatch.setenv("HORA_WARM_WORKERS", "0")  # every warm rank off
    assert {r["parent"] for r in hr.run(_rank_origin, num_proc=1, verbose=0)} == {os.getpid()}


@pytest.mark.timeout(240)
def test_local_prestart_starts_the_server_the_ranks_then_fork_from(monkeypatch):
    from hora.runners.launchers.local import LocalLauncher

    monkeypatch.delenv("HORA_WARM_LOCAL", raising=False)
    launcher = LocalLauncher()
    env = {"PYTHONHASHSEED": "13"}  # a variable of the run's own: a new server key, so none runs yet
    before = _warm_servers()
    fresh = _prestarted(launcher, env, before)
    assert len(fresh) == 1, fresh
    ranks = hr.run(_rank_origin, num_proc=2, backend=launcher, env=env, verbose=0)
    assert {r["parent"] for r in ranks} == fresh
    launcher.prestart(2, {**env, "HORA_WARM_LOCAL": "0"})  # off: nothing starts
    time.sleep(1.0)
    assert _warm_servers() - before == fresh


def test_the_server_key_leaves_out_hora_variables_and_pytests_per_test_one():
    py, cwd = sys.executable, REPO
    key = warm.server_key(py, cwd, {"PATH": "/bin", "PYTEST_CURRENT_TEST": "a.py::t (call)", "HORA_RANK": "0"})
    assert key == warm.server_key(py, cwd, {"PATH": "/bin", "PYTEST_CURRENT_TEST": "b.py::u (setup)"})
    assert key != warm.server_key(py, cwd, {"PATH": "/usr/bin"})  # any other variable may change an import
    assert key != warm.server_key(py, cwd, {"PATH": "/bin", "HORA_WARM_PRELOAD": "json"})  # read by the server
