"""The hora command line, run as a real subprocess (``python -m hora``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

VENV_BIN = os.path.dirname(sys.executable)


def hora(*args: str, cwd: str | None = None, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env["PATH"] = VENV_BIN + os.pathsep + full_env.get("PATH", "")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hora", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def write_script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.timeout(120)
def test_run_prefixes_output_and_writes_output_files(tmp_path):
    script = write_script(tmp_path, "hello.py", """
        import os, sys
        print("hello from", os.environ["HORA_RANK"], "of", os.environ["HORA_SIZE"], os.environ["HORA_HOSTNAME"])
        print("to stderr", os.environ["HORA_LOCAL_RANK"], file=sys.stderr)
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
        assert os.environ["HORA_CYCLE_TIME"] == "3" and os.environ["HORA_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert os.environ["HORA_CACHE_CAPACITY"] == "10" and os.environ["HORA_AUTOTUNE"] == "1"
        assert os.environ["HORA_SHM_ALLREDUCE"] == "0"
        assert os.environ["HORA_TIMELINE"].endswith("tl.json") and os.environ["HORA_TIMELINE_MARK_CYCLES"] == "1"
        assert os.environ["HORA_LOG_LEVEL"] == "ERROR" and os.environ["EXTRA_SETTING"] == "a=b"
        if os.environ["HORA_RANK"] == "0":
            import time
            import hora.runners
            hora.runners.report(step=3, total=4, loss=0.125)
            time.sleep(1.0)  # the launcher polls metrics every 50 ms
    """)
    out_dir = tmp_path / "out"
    res = hora("run", "-np", "2", "--output-filename", str(out_dir), "--cycle-time-ms", "3",
               "--fusion-threshold-mb", "2", "--cache-capacity", "10", "--autotune", "--no-shm",
               "--timeline-filename", str(tmp_path / "tl.json"), "--timeline-mark-cycles", "--log-level", "error",
               "-x", "EXTRA_SETTING=a=b", sys.executable, script)
    assert res.returncode == 0, res.stderr
    assert "[0]<stdout>:hello from 0 of 2 127.0.0.1" in res.stdout
    assert "[1]<stdout>:hello from 1 of 2 127.0.0.1" in res.stdout
    assert "[1]<stderr>:to stderr 1" in res.stderr
    assert "loss=0.125" in res.stderr and "3/4" in res.stderr  # the progress bar
    assert (out_dir / "rank.0" / "stdout").read_text() == "hello from 0 of 2 127.0.0.1\n"
    assert (out_dir / "rank.1" / "stderr").read_text() == "to stderr 1\n"


@pytest.mark.timeout(120)
def test_failing_rank_stops_the_others_exits_with_its_code_and_leaves_no_orphans(tmp_path):
    script = write_script(tmp_path, "fail.py", """
        import os, subprocess, sys, time
        rank = int(os.environ["HORA_RANK"])
        child = subprocess.Popen(["sleep", "300"])          # a grandchild that must not outlive the job
        open(os.path.join(sys.argv[1], f"pids.{rank}"), "w").write(f"{os.getpid()} {child.pid}")
        if rank == 1:
            time.sleep(1.0)
            def load_shard():
                raise FileNotFoundError("shard 7 is missing")
            try:
                load_shard()
            except FileNotFoundError:
                import traceback; traceback.print_exc(); sys.exit(3)
        time.sleep(300)
    """)
    res = hora("run", "-np", "3", sys.executable, script, str(tmp_path))
    assert res.returncode == 3, res.stderr
    assert "hora run: rank 1" in res.stderr and "failed with exit code 3" in res.stderr
    assert "traceback of rank 1" in res.stderr
    assert "FileNotFoundError: shard 7 is missing" in res.stderr
    pids = []
    for rank in range(3):
        pids += [int(x) for x in (tmp_path / f"pids.{rank}").read_text().split()]
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"orphans left: {[p for p in pids if psutil.pid_exists(p)]}"
        time.sleep(0.2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args, message",
    [
        (["-np", "0", "echo", "hi"], "-np must be >= 1, got 0"),
        (["-np", "-3", "echo", "hi"], "-np must be >= 1, got -3"),
        (["-np", "2", "surely-no-such-command-xyz"], "command not found: 'surely-no-such-command-xyz'"),
        (["-np", "2", "-H", "no-such-host.invalid:2", "echo", "hi"], "host 'no-such-host.invalid' does not resolve"),
        (["-np", "3", "-H", "localhost:2", "echo", "hi"], "-np 3 needs 3 slots but the hosts 'localhost:2' offer 2"),
        (["-np", "2", "-H", "localhost:x", "echo", "hi"], "slots must be an integer"),
        (["-np", "2"], "no command given"),
        (["-np", "2", "--start-timeout", "0", "echo"], "--start-timeout must be > 0"),
        (["-np", "2", "--cache-capacity", "-1", "echo"], "--cache-capacity must be >= 0"),
        (["echo", "hi"], "-np is required"),
        (["-np", "2", "-H", "a:1", "--hostfile", "hosts.txt", "echo"], "not allowed with argument -H/--hosts"),
        (["-np", "2", "--hostfile", "hosts.txt", "echo"], "hosts.txt line 3 'b slots=x': slots must be an integer"),
        (["-np", "5", "--hostfile", "ok.txt", "echo"], "-np 5 needs 5 slots but the hosts 'localhost:3' offer 3"),
        (["-np", "2", "-H", "localhost:1,127.0.0.2:1", "--network-address", "198.51.100.7", "echo"],
         "--network-address 198.51.100.7 is not an address of this machine"),
        (["-np", "2", "-H", "localhost:1,127.0.0.2:1", "--network-interface", "nope0", "echo"],
         "network interface 'nope0' does not exist on"),
        (["-np", "2", "--timeline-mark-cycles", "echo"], "--timeline-mark-cycles needs --timeline-filename"),
        (["-np", "2", "-p", "0", "echo"], "--ssh-port must be >= 1"),
        (["-np", "2", "-i", "/no/such/key", "echo"], "ssh identity file '/no/such/key' does not exist"),
    ],
)
def test_usage_errors_exit_2_before_starting_anything(args, message, tmp_path):
    (tmp_path / "hosts.txt").write_text("# hosts\na slots=2\nb slots=x\n")
    (tmp_path / "ok.txt").write_text("localhost slots=2\n127.0.0.1 slots=1\n")
    res = hora("run", *args, cwd=str(tmp_path))
    assert res.returncode == 2
    assert message in res.stderr
    assert "[0]<" not in res.stdout


@pytest.mark.timeout(60)
def test_check_build_prints_horovods_summary_with_horas_answers():
    from hora.native import build_info

    res = hora("run", "--check-build")
    assert res.returncode == 0, res.stderr
    mark = {True: "X", False: " "}
    from hora import __version__

    expected = [f"hora v{__version__}:", "Available Frameworks:", "    [X] PyTorch", "    [ ] MXNet",
                "Available Controllers:", f"    [{mark[build_info.mpi_built()]}] MPI",
                f"    [{mark[build_info.gloo_built()]}] Gloo", "Available Tensor Operations:",
                f"    [{mark[build_info.nccl_built()]}] NCCL", "    [ ] DDL", "    [ ] CCL"]
    for line in expected:
        assert line in res.stdout.splitlines(), (line, res.stdout)


@pytest.mark.timeout(60)
def test_local_hosts_are_accepted(tmp_path):
    import socket

    res = hora("run", "-np", "2", "-H", f"localhost:1,{socket.gethostname()}:1", "echo", "ok")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("<stdout>:ok") == 2


@pytest.mark.timeout(120)
def test_a_rank_that_never_arrives_is_named(tmp_path):
    script = write_script(tmp_path, "late.py", """
        import os, time
        from hora.native.rendezvous import KVClient, WorkerEnv, barrier
        env = WorkerEnv.from_environ()
        if env.rank == 2:
            time.sleep(300)                      # never arrives
        barrier(KVClient(env.rendezvous_addr, env.secret), "hora/native/job/0/init", env.rank, env.size, timeout=300)
    """)
    res = hora("run", "-np", "3", "--start-timeout", "2", sys.executable, script)  # counted from the first arrival
    assert res.returncode != 0
    assert "rank(s) [2] never arrived at rendezvous" in res.stderr
    assert "--start-timeout" in res.stderr


@pytest.mark.timeout(180)
def test_native_init_names_the_missing_rank(tmp_path):
    script = write_script(tmp_path, "native_late.py", """
        import os, time
        if os.environ["HORA_RANK"] == "1":
            time.sleep(300)
        import hora.native as hn
        hn.init()
    """)
    # (--start-timeout counts from the first rank's arrival at the init barrier: rank 0 starting slowly does not eat it)
    res = hora("run", "-np", "2", "--start-timeout", "2", sys.executable, script, env={"HORA_COLLECTIVE_TIMEOUT": "20"})
    assert res.returncode != 0
    assert "[1]" in res.stderr and "never arrived" in res.stderr


@pytest.mark.timeout(60)
def test_python_dash_m_hora_check_lists_what_is_usable():
    res = hora("check")
    assert res.returncode == 0
    for section in ("frameworks:", "backends:", "engines:", "stores:"):
        assert section in res.stdout
    import torch

    assert f"[x] torch              {torch.__version__}" in res.stdout
    assert "[x] gloo" in res.stdout
    from hora.native.backends.shm import availability

    assert f"[{'x' if availability()[0] else ' '}] shm" in res.stdout
    assert "pyspark" in res.stdout and "dask/distributed" in res.stdout
    assert "network:" in res.stdout and "reverse lookup ::ffff:127.0.0.1" in res.stdout
    import importlib.metadata

    try:
        ray_v = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        ray_v = None
    assert (f"[x] ray                ray {ray_v}" if ray_v else "[ ] ray                not installed") in res.stdout
    assert "[x] file://" in res.stdout


@pytest.mark.timeout(30)
def test_check_names_a_reverse_lookup_the_resolver_does_not_answer_in_time():
    from hora.checks import reverse_lookup_check

    def stalled(address: str) -> str:  # a resolver that lost the query and waits to retry
        time.sleep(3)
        return "late"

    ok, detail = reverse_lookup_check("::ffff:10.1.2.3", resolve=stalled, limit=0.2)
    assert not ok
    assert "::ffff:10.1.2.3" in detail and "/etc/hosts" in detail and "0.2 s" in detail
    ok, detail = reverse_lookup_check("::ffff:10.1.2.3", resolve=lambda a: "node-3", limit=2)
    assert ok and detail.startswith("-> node-3 in ")

    def unknown(address: str) -> str:
        raise OSError(-2, "Name or service not known")

    ok, detail = reverse_lookup_check("::ffff:10.1.2.3", resolve=unknown, limit=2)
    assert ok and "(unknown: Name or service not known)" in detail  # answered at once: no wait at init


@pytest.mark.timeout(60)
def test_timeline_summarize_reports_a_missing_file(tmp_path):
    res = hora("timeline", "summarize", str(tmp_path / "nope.json"))
    assert res.returncode == 1
    assert "nope.json" in res.stderr


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_run_mpi_through_mpiexec(tmp_path):
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec", path=VENV_BIN + os.pathsep + os.environ.get("PATH", "")) is None:
        pytest.skip("no mpiexec")
    script = write_script(tmp_path, "mpi_hello.py", """
        import os, sys
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        total = comm.allreduce(comm.Get_rank() + 1)
        sys.stdout.write(f"mpi rank {comm.Get_rank()} of {comm.Get_size()}")
        sys.stdout.flush()  # one line in two writes: mpiexec sees two chunks
        print(" sum", total, os.environ["HORA_BACKEND"], flush=True)
        if comm.Get_rank() == 1 and len(sys.argv) > 1:
            raise SystemExit(int(sys.argv[1]))
    """)
    out_dir = tmp_path / "out"
    res = hora("run", "-np", "2", "--mpi", "--output-filename", str(out_dir), sys.executable, script)
    assert res.returncode == 0, res.stderr
    assert "[0]<stdout>:mpi rank 0 of 2 sum 3 mpi" in res.stdout
    assert "[1]<stdout>:mpi rank 1 of 2 sum 3 mpi" in res.stdout
    assert (out_dir / "rank.1" / "stdout").read_text() == "mpi rank 1 of 2 sum 3 mpi\n"
    res = hora("run", "-np", "2", "--mpi", sys.executable, script, "5")
    assert res.returncode == 5


@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    script = write_script(tmp_path, "sleeper.py", """
        import os, sys, time
        open(os.path.join(sys.argv[1], "pid." + os.environ["HORA_RANK"]), "w").write(str(os.getpid()))
        time.sleep(300)
    """)
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, script, str(tmp_path)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"pid.{r}").exists() for r in range(2)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + 15
    assert "received SIGTERM; stopping all ranks" in err
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(180)
def test_timeline_filename_reaches_the_engine_and_summarize_reads_it(tmp_path):
    script = write_script(tmp_path, "allreduce.py", """
        import numpy as np
        import hora.native as hn
        hn.init()
        for i in range(3):
            out = hn.allreduce(np.ones(16, dtype=np.float32), op=hn.Sum, name=f"t{i}")
            assert float(out[0]) == hn.size()
        hn.shutdown()
        print("ok", hn.__name__)
    """)
    timeline = tmp_path / "timeline.json"
    res = hora("run", "-np", "2", "--timeline-filename", str(timeline), "--cycle-time-ms", "2",
               sys.executable, script)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("<stdout>:ok hora.native") == 2
    assert timeline.exists()
    res = hora("timeline", "summarize", str(timeline))
    assert res.returncode == 0, res.stderr
    assert "COLLECTIVE" in res.stdout


def test_mpi_chunks_are_joined_into_whole_lines_per_rank():
    """mpiexec marks chunks, not lines: pieces of one rank's line must be put back together."""
    from hora.runners.launchers.mpi import CHUNK_RANK_END as E
    from hora.runners.launchers.mpi import CHUNK_START as S
    from hora.runners.launchers.mpi import ChunkJoiner as _ChunkJoiner

    got: list[tuple[int, str]] = []
    j = _ChunkJoiner(lambda rank, text: got.append((rank, text)))
    j.feed_line("a message of mpiexec itself")  # before any chunk: the launcher's own line
    j.feed_line(f"{S}0{E}mpi rank 0 of 2 sum 3")
    j.feed_line(f"{S}1{E}mpi rank 1 of 2{S}1{E} sum 3")  # one line written in two pieces
    j.feed_line(f"{S}0{E}first of two lines")  # one chunk holding two lines
    j.feed_line("second of two lines")
    j.feed_line(f"{S}1{E}half [1] with brackets{S}0{E}rank 0 line")  # rank 1's half stays pending
    j.feed_line(f"{S}1{E} and the rest")
    j.feed_line(f"{S}x{E}not a marker")
    assert got == [
        (-1, "a message of mpiexec itself"),
        (0, "mpi rank 0 of 2 sum 3"),
        (1, "mpi rank 1 of 2 sum 3"),
        (0, "first of two lines"),
        (0, "second of two lines"),
        (0, "rank 0 line"),
        (1, "half [1] with brackets and the rest"),
        (1, f"{S}x{E}not a marker"),
    ]


@pytest.mark.timeout(120)
def test_each_local_rank_gets_its_share_of_the_cores_unless_omp_num_threads_is_set(tmp_path):
    script = write_script(tmp_path, "threads.py", """
        import os
        print("threads", os.environ["OMP_NUM_THREADS"])
    """)
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    res = hora("run", "-np", "2", sys.executable, script, env={"OMP_NUM_THREADS": ""})  # (the suite sets 1)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"<stdout>:threads {share}\n") == 2, res.stdout
    res = hora("run", "-np", "2", "-x", "OMP_NUM_THREADS=3", sys.executable, script)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("<stdout>:threads 3\n") == 2, res.stdout
