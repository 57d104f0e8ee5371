"""``hora run`` and ``hora.run`` on two hosts over a real sshd: 127.0.0.1 (this machine,
started without ssh) and 127.0.0.2 (reached over ssh, as another machine would be)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

VENV_BIN = os.path.dirname(sys.executable)
TWO_HOSTS = "127.0.0.1:2,127.0.0.2:2"


def _env(sshd, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.update(sshd.env)
    env.update(extra or {})
    return env


def hora(sshd, *args: str, cwd, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hora", "run", *args], cwd=str(cwd), env=_env(sshd, env),
                          capture_output=True, text=True, timeout=timeout)


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def assert_gone(pids: list[int], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while alive(pids):
        assert time.monotonic() < deadline, f"processes left behind: {alive(pids)}"
        time.sleep(0.2)


def supervisors(marker: str) -> list[int]:
    """Live hora.runners.rank.remote processes started from the folder ``marker``."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "hora.runners.rank.remote" in cmd and p.cwd().startswith(marker):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def pid_files(folder, n: int) -> list[int]:
    pids = []
    for r in range(n):
        pids += [int(x) for x in (folder / f"pids.{r}").read_text().split()]
    return pids


@pytest.mark.timeout(180)
def test_four_ranks_on_two_hosts_agree_and_see_their_places(sshd, tmp_path):
    body = script(tmp_path, "allreduce.py", """
        import os, sys
        import numpy as np
        import hora.native as hn
        hn.init()
        total = hn.allreduce(np.array([float(hn.rank() + 1)] * 3), op=hn.Sum, name="s")
        print("rank", hn.rank(), "size", hn.size(), "local", hn.local_rank(), hn.local_size(),
              "cross", hn.cross_rank(), hn.cross_size(), "sum", float(total[0]), "host", os.environ["HORA_HOSTNAME"],
              "cwd", os.getcwd(), "x", os.environ.get("HORA_TEST_FWD"), os.environ.get("HORA_TEST_SET"),
              os.environ.get("LAUNCHER_ONLY"), "cycle", os.environ.get("HORA_CYCLE_TIME"),
              "level", os.environ.get("HORA_LOG_LEVEL"), flush=True)
        print("to stderr", hn.rank(), file=sys.stderr)
        hn.shutdown()
    """)
    out = tmp_path / "out"
    res = hora(sshd, "-np", "4", "-H", TWO_HOSTS, *sshd.args(), "--output-filename", str(out), "--cycle-time-ms", "3",
               "--log-level", "warning", "-x", "LAUNCHER_ONLY", "-x", "HORA_TEST_SET=two", "-x", "NOT_SET_ANYWHERE",
               sys.executable, body, cwd=tmp_path, env={"LAUNCHER_ONLY": "forwarded", "HORA_TEST_FWD": "job"})
    assert res.returncode == 0, res.stderr
    assert "-x NOT_SET_ANYWHERE: NOT_SET_ANYWHERE is not set in this environment; not forwarded" in res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if "<stdout>:rank" in line)
    assert len(lines) == 4, res.stdout
    for rank, line in enumerate(lines):
        host = "127.0.0.1" if rank < 2 else "127.0.0.2"
        assert line == (f"[{rank}]<stdout>:rank {rank} size 4 local {rank % 2} 2 cross {rank // 2} 2 sum 10.0 "
                        f"host {host} cwd {tmp_path} x job two forwarded cycle 3 level WARNING")
    for rank in range(4):  # remote ranks' output reaches the launcher's files too
        assert (out / f"rank.{rank}" / "stderr").read_text() == f"to stderr {rank}\n"
    # StrictHostKeyChecking=no, as horovodrun: the new host key was accepted and recorded
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.2]:{sshd.port}", "-f", str(sshd.known_hosts)],
                           capture_output=True, text=True)
    assert found.returncode == 0 and "ssh-ed25519" in found.stdout
    assert not supervisors(str(tmp_path))


@pytest.mark.timeout(180)
def test_a_failing_rank_on_the_second_host_stops_every_rank_on_every_host(sshd, tmp_path):
    body = script(tmp_path, "fail.py", """
        import os, subprocess, sys, time
        rank = int(os.environ["HORA_RANK"])
        child = subprocess.Popen(["sleep", "300"])          # a grandchild that must not outlive the job
        open(os.path.join(sys.argv[1], f"pids.{rank}"), "w").write(f"{os.getpid()} {child.pid}")
        if rank == 3:
            while not all(os.path.exists(os.path.join(sys.argv[1], f"pids.{r}")) for r in range(4)):
                time.sleep(0.1)
            def load_shard():
                raise FileNotFoundError("shard 7 is missing on " + os.environ["HORA_HOSTNAME"])
            try:
                load_shard()
            except FileNotFoundError:
                import traceback; traceback.print_exc(); sys.exit(3)
        time.sleep(300)
    """)
    res = hora(sshd, "-np", "4", "-H", TWO_HOSTS, *sshd.args(), sys.executable, body, str(tmp_path), cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "hora run: rank 3 on 127.0.0.2 failed with exit code 3; stopping every rank" in res.stderr
    assert "hora run: traceback of rank 3 on 127.0.0.2:" in res.stderr
    assert "FileNotFoundError: shard 7 is missing on 127.0.0.2" in res.stderr
    assert_gone(pid_files(tmp_path, 4))
    assert not supervisors(str(tmp_path))


@pytest.mark.timeout(180)
def test_the_rank_that_died_first_is_reported_not_the_survivors_it_broke(sshd, tmp_path):
    body = script(tmp_path, "die.py", """
        import os, signal
        import numpy as np
        import hora.native as hn
        hn.init()
        for i in range(100000):
            hn.allreduce(np.ones(1000), name=f"a{i % 7}")
            if hn.rank() == 3 and i == 50:
                os.kill(os.getpid(), signal.SIGKILL)   # the others then fail inside their collectives
    """)
    res = hora(sshd, "-np", "4", "-H", TWO_HOSTS, *sshd.args(), sys.executable, body, cwd=tmp_path)
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert "hora run: rank 3 on 127.0.0.2 failed with signal 9 (SIGKILL); stopping every rank" in res.stderr


@pytest.mark.timeout(120)
def test_an_unreachable_host_is_named_at_once_and_nothing_starts(sshd, tmp_path):
    body = script(tmp_path, "mark.py", """
        import os, sys
        open(os.path.join(sys.argv[1], "ran." + os.environ["HORA_RANK"]), "w").close()
    """)
    t0 = time.monotonic()
    res = hora(sshd, "-np", "2", "-H", "127.0.0.1:1,127.0.0.3:1", *sshd.args(), sys.executable, body, str(tmp_path),
               cwd=tmp_path)
    assert res.returncode == 255, res.stderr
    assert (f"hora run: ssh to 127.0.0.3 failed (exit code 255): ssh: connect to host 127.0.0.3 port {sshd.port}: "
            "Connection refused") in res.stderr
    assert time.monotonic() - t0 < 60  # ssh's own error, not a start timeout
    assert not list(tmp_path.glob("ran.*"))


@pytest.mark.timeout(120)
def test_a_remote_host_without_hora_names_the_host_and_the_interpreter(sshd, tmp_path):
    system_python = shutil.which("python3", path="/usr/bin")
    if system_python is None:
        pytest.skip("needs a system /usr/bin/python3 without hora")
    res = hora(sshd, "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", *sshd.args(), "--remote-python", system_python,
               "true", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert (f"hora run: host 127.0.0.2: the hora supervisor did not start with the interpreter {system_python} "
            "(exit code 1); is hora installed there?") in res.stderr
    assert "No module named 'hora'" in res.stderr
    res = hora(sshd, "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", *sshd.args(), "true", cwd=tmp_path,
               env={"HORA_REMOTE_PYTHON": "/no/such/python"})
    assert res.returncode == 127, res.stderr
    assert "the hora supervisor did not start with the interpreter /no/such/python" in res.stderr
    assert "/no/such/python: No such file or directory" in res.stderr


def _start(sshd, tmp_path, n: int = 4, env: dict | None = None):
    body = script(tmp_path, "sleeper.py", """
        import os, subprocess, sys, time
        child = subprocess.Popen(["sleep", "300"])
        open(os.path.join(sys.argv[1], "pids." + os.environ["HORA_RANK"]), "w").write(f"{os.getpid()} {child.pid}")
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", str(n), "-H", TWO_HOSTS, *sshd.args(),
                             sys.executable, body, str(tmp_path)], cwd=str(tmp_path), env=_env(sshd, env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"pids.{r}").exists() for r in range(n)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    time.sleep(0.3)  # the pid files are written: let their content land
    return proc


@pytest.mark.timeout(180)
def test_every_rank_and_supervisor_on_every_host_exits_when_hora_run_is_killed(sshd, tmp_path):
    # the launcher SIGKILLed (nothing of it runs its cleanup): the ranks here and on 127.0.0.2, their
    # children, the remote supervisors and the ssh clients end within HORA_HEARTBEAT_TIMEOUT + a few s
    heartbeat = 6
    proc = _start(sshd, tmp_path, env={"HORA_HEARTBEAT_TIMEOUT": str(heartbeat)})
    ssh_clients = [p.pid for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "ssh"]
    assert ssh_clients and supervisors(str(tmp_path))
    proc.kill()
    proc.wait()
    assert_gone(pid_files(tmp_path, 4) + ssh_clients, within=heartbeat + 15)
    assert not supervisors(str(tmp_path))


@pytest.mark.timeout(180)
def test_ctrl_c_and_a_dropped_ssh_connection_stop_every_rank_on_every_host(sshd, tmp_path):
    # Ctrl-C (SIGINT to the launcher)
    first = tmp_path / "sigint"
    first.mkdir()
    proc = _start(sshd, first)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "received SIGINT; stopping all ranks" in err
    assert_gone(pid_files(first, 4))
    assert not supervisors(str(first))
    # the ssh connection to the second host drops: its supervisor stops its ranks, the launcher the others
    second = tmp_path / "drop"
    second.mkdir()
    proc = _start(sshd, second)
    try:
        ssh = [p for p in psutil.Process(proc.pid).children() if p.name() == "ssh"]
        assert len(ssh) == 1
        ssh[0].kill()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "hora run: rank 2 on 127.0.0.2 was lost: host 127.0.0.2: the ssh session ended" in err
    assert_gone(pid_files(second, 4))
    assert not supervisors(str(second))


@pytest.mark.timeout(120)
def test_ssh_config_aliases_are_honoured(sshd, tmp_path):
    """A host known only to ssh's configuration (HostName, Port, IdentityFile) works: hora
    never overrides the config and asks ``ssh -G`` where an alias really is."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host hora-second-host\n  HostName 127.0.0.2\n  Port {sshd.port}\n"
                      f"  IdentityFile {sshd.key}\n  UserKnownHostsFile {sshd.known_hosts}\n")
    res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", "-H", "localhost:1,hora-second-host:1",
                          sys.executable, "-c", "import os; print('on', os.environ['HORA_HOSTNAME'])"],
                         cwd=str(tmp_path), env=_env(sshd, {"HORA_SSH_ARGS": f"-F {config}"}), capture_output=True,
                         text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    assert "[0]<stdout>:on 127.0.0.1" in res.stdout and "[1]<stdout>:on 127.0.0.2" in res.stdout


def _placement(tag):
    import os

    import numpy as np

    import hora.native as hn

    hn.init()
    total = hn.allreduce(np.array([1.0]), op=hn.Sum, name="n")
    return tag, hn.rank(), hn.local_rank(), hn.cross_rank(), os.environ["HORA_HOSTNAME"], float(total[0])


def _raise_on_second_host():
    import os
    import time

    if os.environ["HORA_RANK"] == "2":
        raise ValueError("boom on " + os.environ["HORA_HOSTNAME"])
    time.sleep(120)


def _kill_on_second_host():
    import os
    import signal
    import time

    if os.environ["HORA_RANK"] == "2":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


@pytest.mark.timeout(240)
def test_hora_run_on_two_hosts_returns_every_rank_value_and_names_a_remote_failure(sshd, monkeypatch, tmp_path):
    import hora
    from hora.errors import RankError, RankKilledError, WorkerFailedError

    monkeypatch.setenv("HORA_SSH_ARGS", sshd.env["HORA_SSH_ARGS"])
    monkeypatch.chdir(tmp_path)
    kw = {"hosts": "127.0.0.1:2,127.0.0.2:1", "ssh_port": sshd.port, "ssh_identity_file": sshd.key, "verbose": 0}
    assert hora.run(_placement, args=("t",), num_proc=3, **kw) == [
        ("t", 0, 0, 0, "127.0.0.1", 3.0), ("t", 1, 1, 0, "127.0.0.1", 3.0), ("t", 2, 0, 1, "127.0.0.2", 3.0)]
    with pytest.raises(WorkerFailedError) as info:
        hora.run(_raise_on_second_host, num_proc=3, **kw)
    assert type(info.value) is RankError
    assert info.value.rank == 2 and info.value.host == "127.0.0.2"
    assert "ValueError: boom on 127.0.0.2" in info.value.remote_traceback
    with pytest.raises(RankKilledError) as killed:  # a rank killed on the remote host: the typed kind
        hora.run(_kill_on_second_host, num_proc=3, **kw)
    assert killed.value.rank == 2 and killed.value.host == "127.0.0.2" and killed.value.exitcode == -9
    assert not supervisors(str(tmp_path))


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_mpi_gets_the_host_list_and_reaches_remote_hosts_with_the_ssh_options(sshd, tmp_path):
    pytest.importorskip("mpi4py")
    body = script(tmp_path, "mpi.py", """
        import os
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        total = comm.allreduce(comm.Get_rank() + 1)
        print(f"rank {comm.Get_rank()} of {comm.Get_size()} sum {total} local {os.environ.get('MPI_LOCALRANKID')} "
              f"{os.getcwd()}", flush=True)
    """)
    res = hora(sshd, "--mpi", "-np", "4", "-H", TWO_HOSTS, *sshd.args(), sys.executable, body, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for rank in range(4):
        assert f"[{rank}]<stdout>:rank {rank} of 4 sum 10 local {rank % 2} {tmp_path}" in res.stdout
    # the port reaches mpiexec's ssh: a wrong one fails in ssh's words
    res = hora(sshd, "--mpi", "-np", "4", "-H", "127.0.0.1:2,127.0.0.3:2", *sshd.args(), sys.executable, body,
               cwd=tmp_path, timeout=100)
    assert res.returncode == 255, res.stderr
    assert (f"hora run: ssh to 127.0.0.3 failed (exit code 255): ssh: connect to host 127.0.0.3 port {sshd.port}: "
            "Connection refused") in res.stderr, res.stderr
    assert "mpiexec" not in res.stderr  # named before mpiexec starts
