"""Fault tolerance of hora.runners.run, hora.run and hora run: the root cause of a failed run
is the rank that was lost first, and ``max_failures`` relaunches a run that lost a rank.

Real faults: a rank SIGKILLs itself in the middle of a stream of allreduces (its peer
fails with a CollectiveError at about the same moment), a Dask worker process is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import hora
import hora.runners as hr
from hora.errors import CollectiveError, ConfigError, WorkerFailedError
from hora.runners.driver.faults import FaultKind, kind_of_exception, kind_of_exit
from hora.runners.launchers.spark_errors import engine_failure, kind_of_engine_error
from hora.runners.driver.monitor import Failure, first_failure

from .helpers import assert_no_workers_left, relaunch_lines
from .test_hosts import _Counter
from .test_hosts import _Job as _FakeJob

RECOVERY_LOG = "hora.runners.driver.recovery"


def _train(out_dir: str, kill_on: str, steps: int = 40, kill_worker: bool = False):
    """Allreduce ``steps`` times; rank 1 is SIGKILLed at step 10 when the attempt is in ``kill_on``
    ("1": only the first attempt, "all": every attempt). Writes ``attempt<A>.rank<R>`` on start."""
    import numpy as np

    import hora.native as hn

    attempt = os.environ["HORA_ATTEMPT"]
    open(os.path.join(out_dir, f"attempt{attempt}.rank{hn.rank()}"), "w").close()
    total = 0.0
    for step in range(steps):
        total += float(hn.allreduce(np.ones(256), op=hn.Sum, name=f"recovery.{step}")[0])
        if step == 10 and hn.rank() == 1 and kill_on in ("all", attempt):
            victim = int(os.environ["HORA_SUPERVISOR_PID"]) if kill_worker else os.getpid()
            os.kill(victim, signal.SIGKILL)
            time.sleep(60)
    return hn.rank(), attempt, total


def _attempt_files(out_dir) -> list[str]:
    return sorted(p.name for p in out_dir.iterdir() if p.name.startswith("attempt"))




# -- classification and the root-cause rule, without processes ---------------------------------------------
@pytest.mark.timeout(30)
def test_fault_kinds_tell_lost_ranks_from_user_errors():
    assert kind_of_exit(-9) is FaultKind.SIGNAL and FaultKind.SIGNAL.retriable
    assert kind_of_exit(1, None) is FaultKind.EXIT and not FaultKind.EXIT.retriable
    tb = "Traceback (most recent call last):\n  File \"t.py\", line 1\nhora.errors.CollectiveError: rank 1 is unreachable"
    assert kind_of_exit(1, tb) is FaultKind.COLLECTIVE and FaultKind.COLLECTIVE.symptom
    assert kind_of_exit(1, "Traceback (most recent call last):\nConnectionResetError: [Errno 104]") is \
        FaultKind.INFRASTRUCTURE
    assert kind_of_exit(1, "Traceback (most recent call last):\nValueError: bad loss") is FaultKind.ERROR
    assert kind_of_exception(["hora.errors.CollectiveError", "hora.errors.HoraError"]) is FaultKind.COLLECTIVE
    assert kind_of_exception(["builtins.BrokenPipeError", "builtins.ConnectionError", "builtins.OSError"]) is \
        FaultKind.INFRASTRUCTURE and FaultKind.INFRASTRUCTURE.retriable
    assert kind_of_exception(["builtins.KeyError", "builtins.LookupError"]) is FaultKind.ERROR
    # torch's own collectives (DDP, FSDP) raise Gloo's transport failures as a plain RuntimeError: a symptom of
    # a lost peer, so the killed rank stays the root cause (a ddp fit once failed with max_failures=1 left, its
    # survivor's error reported before the kill); any other RuntimeError is the rank's own error
    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:21910: Connection reset by peer. This is typically caused by a remote worker hanging")
    runtime = ["builtins.RuntimeError", "builtins.Exception", "builtins.BaseException", "builtins.object"]
    assert kind_of_exception(runtime, gloo) is FaultKind.COLLECTIVE
    assert kind_of_exception(runtime, "RuntimeError: mat1 and mat2 shapes cannot be multiplied") is FaultKind.ERROR
    assert kind_of_exception(["builtins.ValueError"], gloo.replace("RuntimeError", "ValueError")) is FaultKind.ERROR
    assert kind_of_exit(1, "Traceback (most recent call last):\n  File \"t.py\", line 9\n" + gloo) is \
        FaultKind.COLLECTIVE
    assert kind_of_engine_error("Job aborted: ExecutorLostFailure (executor 1 exited caused by one of the "
                                "running tasks)") is FaultKind.LOST
    assert kind_of_engine_error("Job aborted: PythonException: ZeroDivisionError") is FaultKind.TASK
    # the task's Python worker (the rank's supervisor) SIGKILLed: infrastructure, not the user's code
    assert engine_failure("Stage failed because barrier task ResultTask(10, 0) finished unsuccessfully. "
                          "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider "
                          "setting 'spark.python.worker.faulthandler.enabled'")[:2] == (FaultKind.LOST, 0)
    spark_text = ("the Spark barrier stage of run r failed: Job aborted due to stage failure: Could not recover from a "
                  "failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task "
                  "ResultTask(1, 1) finished unsuccessfully. / ExecutorLostFailure (executor 1 exited caused by one "
                  "of the running tasks) Reason: Command exited with code 137 / JVM stacktrace:")
    assert engine_failure(spark_text) == (FaultKind.LOST, 1, "was lost: ExecutorLostFailure (executor 1 exited "
                                          "caused by one of the running tasks): Command exited with code 137")
    assert not any(k.retriable for k in (FaultKind.ERROR, FaultKind.COLLECTIVE, FaultKind.TASK, FaultKind.TIMEOUT))


@pytest.mark.timeout(30)
def test_each_kind_of_fault_is_a_class_of_its_own():
    import pickle

    from hora import errors
    from hora.runners.driver.faults import fault_kind
    from hora.runners.launchers.spark_errors import stage_failure

    table = [  # class, kind, retriable, symptom
        (errors.RankKilledError, FaultKind.SIGNAL, True, False),
        (errors.WorkerLostError, FaultKind.LOST, True, False),
        (errors.RanksNotStartedError, FaultKind.START, True, False),
        (errors.InfrastructureError, FaultKind.INFRASTRUCTURE, True, True),
        (errors.RankError, FaultKind.ERROR, False, False),
        (errors.RankExitError, FaultKind.EXIT, False, False),
        (errors.CollectiveFailedError, FaultKind.COLLECTIVE, False, True),
        (errors.TaskFailedError, FaultKind.TASK, False, True),
        (errors.RunTimeoutError, FaultKind.TIMEOUT, False, False),
    ]
    assert {row[1] for row in table} == set(FaultKind)  # every kind has its class
    for cls, kind, retriable, symptom in table:
        assert issubclass(cls, WorkerFailedError) and cls.__name__ in errors.__all__
        assert (cls.kind, cls.retriable, cls.symptom) == (kind, retriable, symptom)
        assert errors.failure_class(kind) is cls
        err = cls("rank 1 on h failed", rank=1, host="h", remote_traceback="Traceback ...", exitcode=-9)
        assert fault_kind(err) is kind
        back = pickle.loads(pickle.dumps(err))  # a failure crossing processes keeps its class and fields
        assert type(back) is cls and (back.rank, back.host, back.exitcode, back.message) == (1, "h", -9,
                                                                                          "rank 1 on h failed")
    assert issubclass(errors.RanksNotStartedError, errors.RendezvousError)
    assert issubclass(errors.RunTimeoutError, TimeoutError)
    assert errors.WorkerFailedError.kind is None and not errors.WorkerFailedError.retriable
    assert fault_kind(WorkerFailedError("unclassified")) is FaultKind.ERROR
    assert fault_kind(errors.RendezvousError("a key never appeared")) is FaultKind.START
    # a Failure raises the class of its kind
    assert type(Failure.from_exit(1, 1, "h", -9, None).error()) is errors.RankKilledError
    assert type(Failure.from_exit(1, 1, "h", 3, None).error()) is errors.RankExitError
    # Spark's text is read at the Spark boundary only: a lost executor names its rank
    lost = stage_failure("the Spark barrier stage of run r failed: Stage failed because barrier task ResultTask(1, 1) "
                         "finished unsuccessfully. / ExecutorLostFailure (executor 1 exited caused by one of the "
                         "running tasks) Reason: Command exited with code 137")
    assert type(lost) is errors.WorkerLostError and lost.rank == 1 and lost.message.startswith("was lost: ")
    task = stage_failure("the Spark barrier stage of run r failed: PythonException: ZeroDivisionError")
    assert type(task) is errors.TaskFailedError and task.rank is None


class _Service(_Counter):
    def done(self):
        return set()


class _Job(_FakeJob):
    def ended(self):
        return set()


@pytest.mark.timeout(30)
def test_a_lost_rank_seen_after_the_survivors_collective_error_is_the_root_cause():
    service, job = _Service(), _Job()
    job.items.append(Failure(seq=service.next_seq(), rank=0, host="h0", kind=FaultKind.COLLECTIVE,
                             message="raised CollectiveError: shared-memory allreduce: rank 1 is unreachable",
                             source="rank"))

    def later():  # the killed rank's exit is seen only after its peer's report, with a higher number
        time.sleep(0.5)
        job.items.append(Failure.from_exit(service.next_seq(), 1, "h1", -9, None))

    threading.Thread(target=later).start()
    chosen = first_failure(service, job, job.failures(), num_proc=2)
    assert (chosen.rank, chosen.host, chosen.kind) == (1, "h1", FaultKind.SIGNAL)
    assert str(chosen.error()) == "rank 1 on h1 failed with signal 9 (SIGKILL)"

    # every rank failed with a CollectiveError and none was lost: ranks disagree; no waiting for a root cause
    service, job = _Service(), _Job()
    job.items += [Failure(seq=service.next_seq(), rank=r, host="h", kind=FaultKind.COLLECTIVE, source="rank",
                          message="raised CollectiveError: shapes differ") for r in (1, 0)]
    t0 = time.monotonic()
    chosen = first_failure(service, job, job.failures(), num_proc=2)
    assert chosen.rank == 1 and chosen.kind is FaultKind.COLLECTIVE and time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_bad_max_failures_fails_before_anything_starts():
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="max_failures must be an int >= 0"):
            hr.run(len, args=([],), num_proc=1, max_failures=bad)
    with pytest.raises(ConfigError, match="max_failures must be an int >= 0"):
        hora.run(len, args=([],), num_proc=1, max_failures=-1)
    with pytest.raises(ConfigError, match="max_failures needs hora's own launcher"):
        hora.run(len, args=([],), num_proc=1, use_mpi=True, max_failures=1)


# -- local processes -----------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_local_rank_killed_mid_allreduce_is_relaunched(tmp_path, caplog):
    from hora.store import Store

    caplog.set_level(logging.WARNING, logger=RECOVERY_LOG)
    out = tmp_path / "marks"
    out.mkdir()
    store = Store.create(f"file://{tmp_path / 'store'}")
    results = hr.run(_train, args=(str(out), "1"), num_proc=2, run_id="recover-local", verbose=0, max_failures=2,
                     store=store)
    assert results == [(0, "2", 80.0), (1, "2", 80.0)]  # attempt 2 ran every step, every allreduce summed 2 ranks
    assert _attempt_files(out) == ["attempt1.rank0", "attempt1.rank1", "attempt2.rank0", "attempt2.rank1"]
    (line,) = relaunch_lines(caplog)
    assert "attempt 1 of 3 failed: rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in line
    assert "relaunching 2 rank(s) on local (attempt 2 of 3)" in line
    logs = store.layout.logs_dir("recover-local")
    assert store.exists(f"{logs}/rank.1.log") and store.exists(f"{logs}/rank.1.attempt2.log")
    assert_no_workers_left("recover-local")


@pytest.mark.timeout(300)
def test_a_fault_that_keeps_happening_ends_after_max_failures_relaunches(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=RECOVERY_LOG)
    with pytest.raises(WorkerFailedError) as info:
        hr.run(_train, args=(str(tmp_path), "all"), num_proc=2, run_id="recover-always", verbose=0, max_failures=2)
    err = info.value
    assert _attempt_files(tmp_path) == [f"attempt{a}.rank{r}" for a in (1, 2, 3) for r in (0, 1)]
    assert len(relaunch_lines(caplog)) == 2
    assert [(a.attempt, a.rank, a.host, a.kind) for a in err.attempts] == [
        (a, 1, "127.0.0.1", FaultKind.SIGNAL) for a in (1, 2, 3)]
    assert type(err) is hora.errors.RankKilledError
    lines = str(err).splitlines()
    assert lines[0] == ("run recover-always: 3 attempts failed (max_failures=2); the last: rank 1 on 127.0.0.1 "
                        "failed with signal 9 (SIGKILL)")
    assert lines[1:4] == [f"  attempt {a} (2 ranks): rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL) "
                          "[a rank was killed]" for a in (1, 2, 3)]
    assert (err.rank, err.host, err.exitcode) == (1, "127.0.0.1", -9)
    assert_no_workers_left("recover-always")


def _user_error(out_dir: str, exc_type: str):
    open(os.path.join(out_dir, f"attempt{os.environ['HORA_ATTEMPT']}.rank{os.environ['HORA_RANK']}"), "w").close()
    if exc_type == "collective":  # every rank: what ranks that disagree about a collective raise
        raise CollectiveError("ranks disagree about the shape of tensor 'w'")
    if os.environ["HORA_RANK"] == "1":
        raise ValueError("a bug in the loss")
    time.sleep(120)


@pytest.mark.timeout(180)
def test_user_errors_fail_at_once_with_max_failures(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=RECOVERY_LOG)
    for exc_type, expected in (("value", "rank 1 on 127.0.0.1 raised ValueError: a bug in the loss"),
                               ("collective", "raised CollectiveError: ranks disagree")):
        out = tmp_path / exc_type
        out.mkdir()
        with pytest.raises(WorkerFailedError) as info:
            hr.run(_user_error, args=(str(out), exc_type), num_proc=2, verbose=0, max_failures=3)
        assert expected in str(info.value).splitlines()[0]
        assert not hasattr(info.value, "attempts")  # exactly the error of a run without max_failures
        assert {p.split(".")[0] for p in _attempt_files(out)} == {"attempt1"}
    assert relaunch_lines(caplog) == []


# -- engines -------------------------------------------------------------------------------------------------
@pytest.mark.timeout(400)
def test_spark_rank_killed_mid_allreduce_is_relaunched(spark, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=RECOVERY_LOG)
    results = hr.run(_train, args=(str(tmp_path), "1"), num_proc=2, backend="spark", spark=spark,
                     run_id="recover-spark", verbose=0, max_failures=1, start_timeout=120)
    assert results == [(0, "2", 80.0), (1, "2", 80.0)]
    (line,) = relaunch_lines(caplog)
    assert "attempt 1 of 2 failed: rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in line
    assert "on spark (attempt 2 of 2)" in line
    assert_no_workers_left("recover-spark")


@pytest.mark.timeout(400)
def test_dask_worker_killed_mid_allreduce_is_relaunched_on_the_restarted_worker(dask_client, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=RECOVERY_LOG)
    dask_client.wait_for_workers(2, timeout=120)
    before = set(dask_client.scheduler_info(n_workers=-1)["workers"])
    results = hr.run(_train, args=(str(tmp_path), "1"), kwargs={"kill_worker": True}, num_proc=2, backend="dask",
                     client=dask_client, run_id="recover-dask", verbose=0, max_failures=1, start_timeout=120)
    assert results == [(0, "2", 80.0), (1, "2", 80.0)]
    (line,) = relaunch_lines(caplog)
    assert "attempt 1 of 2 failed: rank 1 on 127.0.0.1 was lost: Dask worker tcp://127.0.0.1:" in line
    lost = line.split("Dask worker ")[1].split(" ")[0]
    assert lost in before and lost not in dask_client.scheduler_info(n_workers=-1)["workers"]
    assert_no_workers_left("recover-dask", within=20)
    dask_client.wait_for_workers(2, timeout=120)


# -- hora run ------------------------------------------------------------------------------------------------
SCRIPT = """
import os, signal, time
import numpy as np
import hora.torch as hvd
import torch
hvd.init()
for step in range(30):
    hvd.allreduce(torch.ones(64), name=f"cli.{step}")
    if step == 5 and hvd.rank() == 1 and os.environ["HORA_ATTEMPT"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
print(f"rank {hvd.rank()} finished attempt {os.environ['HORA_ATTEMPT']}", flush=True)
hvd.shutdown()
"""


@pytest.mark.timeout(300)
def test_hora_run_max_failures_relaunches_a_killed_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", "--max-failures", "1", sys.executable,
                          str(script)], capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[0]<stdout>:rank 0 finished attempt 2" in res.stdout and "[1]<stdout>:rank 1 finished attempt 2" in res.stdout
    assert "attempt 1 of 2 failed: rank 1 on 127.0.0.1 failed with signal 9 (SIGKILL)" in res.stderr
    for args, message in ((["--max-failures", "-1"], "--max-failures must be >= 0"),
                          (["--mpi", "--max-failures", "1"], "--max-failures needs hora's own launcher")):
        res = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "1", *args, "true"], capture_output=True,
                             text=True, env=env, timeout=60)
        assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.timeout(30)
def test_a_failed_stage_names_the_ranks_typed_failure_from_the_tasks_traceback():
    """Spark's error for a failed barrier stage holds the task's Python traceback; the error hora
    raises quotes the rank's failure from it, whatever subclass of WorkerFailedError it is."""
    import types

    from hora.runners.launchers.spark_errors import stage_error

    spec = types.SimpleNamespace(run_id="run-1", num_proc=2)
    for name in ("RankError", "RankKilledError", "WorkerFailedError"):
        text = ("org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
                "Traceback (most recent call last):\n  File \"supervise.py\", line 9, in supervise\n"
                f"hora.errors.{name}: rank 1 on 10.0.0.2 raised KeyError: 'x'\n\tat org.apache.spark...")
        err = stage_error(RuntimeError(text), spec, launcher=None)
        assert f"hora.errors.{name}: rank 1 on 10.0.0.2 raised KeyError" in str(err), str(err)
