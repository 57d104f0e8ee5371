"""Elastic ``hora run`` with a worker on a second host reached over ssh (127.0.0.2 through a
real sshd): it joins, and when it is killed its host is blacklisted and the job goes on."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.ssh.sshd import SshdUnavailable, running_sshd

from .helpers import HoraRun, discovery_script, no_processes_of, worker_pid

COUNTER = Path(__file__).parent / "elastic_counter.py"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    try:
        with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
            yield server
    except SshdUnavailable as exc:
        pytest.skip(f"needs a real OpenSSH server: {exc}")


@pytest.mark.timeout(400)
def test_a_worker_over_ssh_joins_and_its_loss_blacklists_its_host(sshd, tmp_path):
    script, _ = discovery_script(tmp_path, "localhost:1\n127.0.0.2:1\n")
    stop = tmp_path / "stop"
    run = HoraRun([*sshd.args(), "--min-np", "1", "--host-discovery-script", str(script), sys.executable, str(COUNTER),
                   str(stop)],
                  tmp_path, env=dict(sshd.env))
    try:
        run.wait_for(r"step=3 size=2 ")
        os.kill(worker_pid(COUNTER, "127.0.0.2[0]"), signal.SIGKILL)
        mark = len(run.lines)
        run.wait_for(r"step=\d+ size=1 ", after=mark)
        stop.touch()
        code = run.finish()
    finally:
        run.kill()
    text = "\n".join(run.lines)
    assert code == 0, text[-4000:]
    assert re.search(r"worker 127\.0\.0\.2\[0\] \(rank 1 on 127\.0\.0\.2 failed with signal 9 \(SIGKILL\)\)", text)
    assert "host 127.0.0.2 is blacklisted" in text
    assert re.search(r"<stdout>:done rank=0 size=1 step=\d+", text)
    no_processes_of(COUNTER)
