"""Elastic ``hora run`` with a worker on a second host reached over ssh (127.0.0.2 through a
real sshd): it joins, and when it is killed its host is blacklisted and the job goes on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.ssh.conftest import sshd  # noqa: F401  (the real sshd of the ssh launcher's tests)

from .helpers import HoraRun, discovery_script, kill_then_stop, no_processes_of

COUNTER = Path(__file__).parent / "elastic_counter.py"


@pytest.mark.timeout(400)
def test_a_worker_over_ssh_joins_and_its_loss_blacklists_its_host(sshd, tmp_path):
    script, _ = discovery_script(tmp_path, "localhost:1\n127.0.0.2:1\n")
    stop = tmp_path / "stop"
    run = HoraRun([*sshd.args(), "--min-np", "1", "--host-discovery-script", str(script), sys.executable, str(COUNTER),
                   str(stop)],
                  tmp_path, env=dict(sshd.env))
    try:
        run.wait_for(r"step=3 size=2 ")
        code, text = kill_then_stop(run, COUNTER, "127.0.0.2[0]", stop, size_after=1)
    finally:
        run.kill()
    assert code == 0, text[-4000:]
    assert re.search(r"worker 127\.0\.0\.2\[0\] \(rank 1 on 127\.0\.0\.2 failed with signal 9 \(SIGKILL\)\)", text)
    assert "host 127.0.0.2 is blacklisted" in text
    assert re.search(r"<stdout>:done rank=0 size=1 step=\d+", text)
    no_processes_of(COUNTER)
