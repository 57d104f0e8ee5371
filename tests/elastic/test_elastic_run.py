"""Elastic ``hora run --host-discovery-script``: ranks join and leave a running job.

A real ``hora run`` with a discovery script that prints a hosts file the test rewrites.
``localhost`` and ``127.0.0.1`` are two hosts of this machine as Horovod's rules see them
(a failing worker blacklists its host, so a kill needs a second host to go on with).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import HoraRun, discovery_script, kill_then_stop, no_processes_of

COUNTER = Path(__file__).parent / "elastic_counter.py"


@pytest.mark.timeout(600)
def test_ranks_join_leave_and_survive_a_kill(tmp_path):
    script, hosts = discovery_script(tmp_path, "localhost:2\n")
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
        code, text = kill_then_stop(run, COUNTER, "127.0.0.1[0]", stop, size_after=1)  # a rank is killed
    finally:
        run.kill()
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
    no_processes_of(COUNTER)


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
