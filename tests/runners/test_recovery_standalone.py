"""A lost Spark executor: on a real standalone cluster (master + two workers on 127.0.0.1 and
127.0.0.2, through a Spark Connect server), a rank SIGKILLs its own executor JVM in the middle of
a stream of allreduces; ``max_failures=1`` relaunches the barrier stage on the executor the
standalone worker starts in its place."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

import hora.runners as hr

from .helpers import assert_no_workers_left, relaunch_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _kill_my_executor_once(out_dir: str):
    import numpy as np
    import psutil

    import hora.native as hn

    attempt = os.environ["HORA_ATTEMPT"]
    total = 0.0
    for step in range(30):
        total += float(hn.allreduce(np.ones(64), op=hn.Sum, name=f"standalone.recovery.{step}")[0])
        if step == 5 and attempt == "1" and hn.rank() == 1:
            proc = psutil.Process()
            while proc is not None and "CoarseGrainedExecutorBackend" not in " ".join(proc.cmdline()):
                proc = proc.parent()
            assert proc is not None, "no executor JVM above this rank"
            with open(os.path.join(out_dir, "killed"), "w") as fh:
                fh.write(f"{proc.pid} {os.environ['HORA_HOSTNAME']}")
            os.kill(proc.pid, signal.SIGKILL)
            time.sleep(120)
    return hn.rank(), attempt, total, os.environ["HORA_HOSTNAME"]


@pytest.mark.timeout(600)
def test_a_killed_executor_jvm_is_relaunched(standalone_connect, tmp_path, caplog):
    _, spark = standalone_connect
    caplog.set_level(logging.WARNING, logger="hora.runners.recovery")
    launcher = hr.SparkLauncher(spark, task_cpus=2)  # one rank per worker: rank 1's executor is the other host's
    results = hr.run(_kill_my_executor_once, args=(str(tmp_path),), num_proc=2, backend=launcher,
                     run_id="standalone-executor-kill", verbose=0, max_failures=1, start_timeout=240)
    assert [r[:3] for r in results] == [(0, "2", 60.0), (1, "2", 60.0)]
    _pid, host = (tmp_path / "killed").read_text().split()
    lines = relaunch_lines(caplog)
    assert len(lines) == 1, lines
    assert "attempt 1 of 2 failed:" in lines[0] and "(a host, executor or worker was lost, retriable)" in lines[0]
    assert f"rank 1 on {host} was lost: ExecutorLostFailure (executor " in lines[0], lines[0]
    assert_no_workers_left("standalone-executor-kill", within=30)
