"""``hora run`` called in this process (``hora.cli.main``), as the console script would: the
parser, the command's configuration, the launcher's local ranks, the exit code and the printed
failure, all on this side of a subprocess (where coverage sees them)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from hora import cli


@pytest.mark.timeout(120)
def test_hora_run_in_process_prefixes_rank_output_and_returns_the_first_failure(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # each rank gets its share of the cores
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print("rank", os.environ["HORA_RANK"], "of", os.environ["HORA_SIZE"], "threads", os.environ["OMP_NUM_THREADS"])
        if len(sys.argv) > 1 and os.environ["HORA_RANK"] == "1":
            sys.exit(int(sys.argv[1]))
    """))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    assert cli.main(["run", "-np", "2", "-x", "EXTRA=1", sys.executable, str(script)]) == 0
    out = capfd.readouterr().out
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"[0]<stdout>:rank 0 of 2 threads {share}" in out and f"[1]<stdout>:rank 1 of 2 threads {share}" in out
    code = cli.main(["run", "-np", "2", sys.executable, str(script), "3"])
    err = capfd.readouterr().err
    assert code == 3 and "rank 1 on 127.0.0.1 failed with exit code 3" in err, (code, err)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # the CLI's handlers are put back


@pytest.mark.timeout(60)
def test_hora_run_in_process_refuses_a_bad_flag_naming_it(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "-np", "0", sys.executable, "-c", "pass"])
    assert "-np" in capsys.readouterr().err
